"""The fp32 ``row_gemv`` kernel vs oneDNN for 1-16 rows: every linear of one SmolLM2-135M forward.

    chrt -f 5 .venv/bin/python benchmarks/bench_row_gemv.py [--rows 1,2,3,4,5,8,13,16] [--reps 7]

Prints one markdown table row per row count: ``Linear`` with the kernel (where its probe matched oneDNN bit for
bit) and with ``fast_linear.USE_ROW_KERNEL = False`` (oneDNN, a single row padded to 2), best of ``--reps``,
interleaved. To see an AVX2-only CPU on an AVX-512 one, run it with numba compiling for Haswell and oneDNN / MKL
capped at AVX2:
``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=+avx,+avx2,+fma,... ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``.
"""
from __future__ import annotations

import argparse

import torch

import specdec_cli.models.fast_linear as fast_linear
from bench_int8_gemm import SHAPES, best_ms
from bench_model import machine
from specdec_cli.models import row_gemv
from specdec_cli.models.fast_linear import Linear


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,3,4,5,8,13,16")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    linears = []
    for out_features, in_features in SHAPES:
        linear = Linear(in_features, out_features)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(out_features, in_features, generator=generator) * 0.02)
        linears.append(linear)
    print(f"{machine()}; row_gemv.GROUP_ROWS={row_gemv.GROUP_ROWS}, MAX_ROWS={row_gemv.MAX_ROWS}\n")
    print("| rows | row_gemv ms | oneDNN ms | oneDNN / row_gemv | row_gemv / its 1 row |")
    print("|---:|---:|---:|---:|---:|")
    one_row = None
    with torch.inference_mode():
        for rows in [int(r) for r in args.rows.split(",")]:
            inputs = {k: torch.randn(rows, k, generator=generator) for k in (576, 1536)}
            times = {}
            for use_kernel in (True, False):
                fast_linear.USE_ROW_KERNEL = use_kernel
                times[use_kernel] = best_ms(lambda: [lin(inputs[lin.in_features]) for lin in linears], args.reps)
            one_row = one_row or times[True]
            print(f"| {rows} | {times[True]:.1f} | {times[False]:.1f} | {times[False] / times[True]:.2f}x | "
                  f"{times[True] / one_row:.2f} |", flush=True)


if __name__ == "__main__":
    main()
