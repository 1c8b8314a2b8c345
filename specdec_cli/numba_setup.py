"""numba's code generator, told to use the 512-bit vectors of an AVX-512 CPU (``SPECDEC_WIDE_VECTORS=0``: not).

LLVM tunes Intel's AVX-512 cores (Ice Lake, Rocket Lake, Sapphire Rapids, ...) to prefer 256-bit vectors, and
numba compiles for the host's tuning: on such a host ``row_gemv``'s FMAs ran on ymm registers, half their width,
and calls of 5 to 9 rows were bound by them (1.11 / 1.36 / 1.48x one row's time for 5 / 8 / 9 rows). With zmm:
1.00 / 1.06 / 1.29x, a 5-token verify 6-9% faster, an int8 EAGLE-3 head step 13-20% faster, a one-token decode
1-3% slower, which prefetching one-row calls too wins back (``row_gemv.PREFETCH_MIN_ROWS``;
benchmarks/results_row_gemv.md). Each output is still one in-order FMA chain per lane, so results
are bit for bit the same at either width.
"""
from __future__ import annotations

import os

import llvmlite.binding
import numba

OPT_OUT = "SPECDEC_WIDE_VECTORS"


def use_wide_vectors() -> None:
    """Where the host has AVX-512F, NUMBA_CPU_FEATURES is unset and SPECDEC_WIDE_VECTORS is not 0: compile with
    the host's features minus LLVM's 256-bit preference. Call before the first numba compile in the process (both
    kernel modules do, at import); later it changes nothing, as numba fixes its target machine once."""
    if numba.config.CPU_FEATURES is not None or os.environ.get(OPT_OUT, "1") == "0":
        return
    features = _host_features()
    if features is not None and features.get("avx512f"):
        numba.config.CPU_FEATURES = features.flatten() + ",-prefer-256-bit"


def compiles_for_avx512() -> bool:
    """Whether numba compiles for AVX-512F: its NUMBA_CPU_FEATURES where set (``use_wide_vectors`` sets them on
    AVX-512 hosts), else this host's features as LLVM (numba's code generator) reads them."""
    if numba.config.CPU_FEATURES:
        return "+avx512f" in numba.config.CPU_FEATURES.split(",")
    features = _host_features()
    return bool(features is not None and features.get("avx512f"))


def wide_vectors() -> bool:
    """Whether numba compiles without LLVM's 256-bit preference (``use_wide_vectors`` took effect, or the user's
    NUMBA_CPU_FEATURES say so)."""
    return "-prefer-256-bit" in (numba.config.CPU_FEATURES or "").split(",")


def _host_features():
    """llvmlite's feature map of this host, or None where LLVM cannot read it."""
    try:
        return llvmlite.binding.get_host_cpu_features()
    except RuntimeError:
        return None
