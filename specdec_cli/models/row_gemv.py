"""A fp32 GEMM for 1 to ``MAX_ROWS`` rows that rounds exactly like oneDNN's multi-row GEMM, faster for so few rows.

oneDNN's fp32 GEMM (M >= 2, prepacked weights) computes each output as in-order FMA chains over K that are
added at the end; on the CPUs measured (a Xeon and an AMD EPYC, both AVX-512), one chain over k < 512 and one
over k >= 512 for K = 576 (1024 for K = 1536). ``RowGemv`` computes each row the same way - two in-order FMA
chains split at ``split``, then their sum - from a copy of the weight packed as [ceil(N / BLOCK), K, BLOCK], so
BLOCK outputs of every row advance together over one contiguous weight stream, their accumulators held in
registers; the blocks are spread over torch's thread count. A 1-token decode with it is within ~3% of one
with MKL's GEMV and 1.2x faster than padding the row to 2 for oneDNN (benchmarks/results_model.md). With
AVX-512's 32 vector registers the accumulators of up to 8 rows stay (mostly) in registers, and the weight
stream - not the arithmetic - sets the time: 1 to 7 rows of SmolLM2-135M's GEMMs take about the same ~19 ms,
oneDNN 24-31 ms, so a K+1 = 5 token verify costs about what a decode does (benchmarks/results_steps.md); 9 to
16 rows take two passes over each weight block, the second from L2 (13 rows 25 ms, oneDNN 47 ms: tree
verification). With AVX2's 16 registers the kernel takes 1 or 2 rows (more, grouped like 9-16 rows above,
measured no faster than oneDNN in a whole forward: benchmarks/results_row_gemv.md).

On Intel AVX-512 hosts numba is told to use 512-bit vectors (``numba_setup``): LLVM's default tuning there
prefers 256 bits, which made 5+ rows FMA-bound (8 rows 1.36x one row's time, 1.06x with zmm).

The same kernel takes int8 weights (``quantize.Int8Linear``): each is converted to float32 in registers, exactly,
so the arithmetic is unchanged.

Nothing documents that order, so it is probed: ``RowGemv.probe`` tries each candidate split against
oneDNN's own output on random rows (1 to MAX_ROWS of them) and returns a kernel only where one matches bit
for bit. Elsewhere (another CPU or oneDNN version, a bias rounded differently) it returns None and the caller
keeps padding the row.
This module imports numba at the top: import it lazily and pad where that import fails.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Optional

import llvmlite.ir
import numba
import numpy as np
import torch
from numba.core import cgutils, types
from numba.extending import intrinsic

from specdec_cli.numba_setup import compiles_for_avx512, use_wide_vectors, wide_vectors

use_wide_vectors()


MAX_ROWS = 16 if compiles_for_avx512() else 2
"""Most rows one call takes (AVX-512: 32 vector registers; AVX2's 16 hold the accumulators of 2 rows). At 16 rows
the kernel is still ahead (the model's GEMMs: 36 ms vs oneDNN's 43 ms); beyond, oneDNN's blocked GEMM catches up."""
BLOCK = 48
"""Outputs computed together: BLOCK/8 256-bit (BLOCK/16 512-bit) accumulators per row and chain, fed by one
contiguous weight stream."""
SPLIT_STEP = 64
"""Candidate chain splits are the multiples of this below K (and K itself: one chain)."""

_splits: dict[tuple[int, int, bool, int], Optional[int]] = {}  # (N, K, bias, threads) -> the split that matched


class RowGemv:
    """y = x @ weight.T (+ bias) for x [M, K], 1 <= M <= MAX_ROWS -> [M, N], in oneDNN's rounding order."""

    MAX_ROWS = MAX_ROWS

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], split: int) -> None:
        self.packed = pack_blocks(weight.float())
        self.bias = None if bias is None else bias.detach().contiguous().numpy()
        self.out_features, self.split = weight.shape[0], split

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] float32 (CPU), M <= MAX_ROWS -> [M, N]."""
        y = gemm_rows(x, self.packed, self.split)
        if y.shape[1] != self.out_features:  # N not a multiple of BLOCK (a view costs ~1.5 us: only when needed)
            y = y[:, : self.out_features]
        return y if self.bias is None else y + torch.from_numpy(self.bias)

    @classmethod
    def probe(
        cls,
        weight: torch.Tensor,
        bias: Optional[torch.Tensor],
        reference: Callable[[torch.Tensor], torch.Tensor],
    ) -> Optional[RowGemv]:
        """A kernel whose rows equal ``reference`` (x [M, K] -> [M, N], oneDNN) bit for bit, or None.

        Every row count up to MAX_ROWS is checked. The split found is remembered per shape and thread count,
        so layers of one shape probe once.
        """
        out_features, in_features = weight.shape
        key = (out_features, in_features, bias is not None, torch.get_num_threads())
        if key in _splits and _splits[key] is None:
            return None  # this shape already failed: no copy, no reference call
        candidates = [_splits[key]] if key in _splits else _candidate_splits(in_features)
        generator = torch.Generator(device="cpu").manual_seed(0)
        rows = torch.randn(MAX_ROWS, in_features, generator=generator, device="cpu")
        want = reference(rows)
        kernel = cls(weight, bias, in_features)
        found = None
        for split in candidates:
            kernel.split = split
            if all(torch.equal(kernel(rows[:m]), want[:m]) for m in range(1, MAX_ROWS + 1)):
                found = split
                break
        _splits[key] = found
        return None if found is None else kernel


def pack_blocks(weight: torch.Tensor) -> np.ndarray:
    """weight [N, K] (float32 or int8) -> [ceil(N / BLOCK), K, BLOCK], zero-padded: for each block of BLOCK
    outputs, their K weights k-major (one contiguous stream per block)."""
    out_features, in_features = weight.shape
    blocks = -(-out_features // BLOCK)
    padded = torch.zeros(blocks * BLOCK, in_features, dtype=weight.dtype, device="cpu")
    padded[:out_features] = weight.detach()
    return np.ascontiguousarray(padded.view(blocks, BLOCK, in_features).permute(0, 2, 1).numpy())


def gemm_rows(x: torch.Tensor, packed: np.ndarray, split: int) -> torch.Tensor:
    """x [M, K] float32 (CPU), 1 <= M <= MAX_ROWS, @ a ``pack_blocks`` weight -> [M, blocks * BLOCK] float32.

    Each output is two in-order FMA chains (k < split, k >= split) added at the end; int8 weights are
    converted to float32 exactly, so they take the same arithmetic. A row's result never depends on the others.
    """
    out = torch.empty(x.shape[0], packed.shape[0] * BLOCK, dtype=torch.float32, device="cpu")
    sync_threads()
    groups = _ROW_TAGS[x.shape[0]]
    if x.requires_grad or not x.is_contiguous():
        x = x.detach().contiguous()
    if len(groups) == 1:
        _gemm(x.numpy(), packed, split, out.numpy(), groups[0])
    else:
        _gemm_two_groups(x.numpy(), packed, split, out.numpy(), *groups)
    return out


_numba_threads = threading.local()  # numba's thread count is per calling thread: what it was last set to here


def sync_threads() -> None:
    """Give numba's parallel kernels torch's thread count (``numba.set_num_threads``), once per change and
    calling thread: asking numba each call costs ~0.7 us, a few percent of a small GEMM's call."""
    threads = torch.get_num_threads()
    if getattr(_numba_threads, "value", None) != threads:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        _numba_threads.value = threads


def _candidate_splits(in_features: int) -> list[int]:
    """K (one chain) first, then the multiples of SPLIT_STEP below it, largest first."""
    return [in_features] + list(range((in_features - 1) // SPLIT_STEP * SPLIT_STEP, 0, -SPLIT_STEP))


GROUP_ROWS = 8
"""Rows whose accumulators one pass over a weight block holds (6 zmm each: 8 rows = 48, a few spill); more rows
take a second pass over the block while it is still in L2, so the weights stream from memory once."""


def _row_groups(rows: int) -> tuple[tuple[int, ...], ...]:
    """``rows`` split into 1 or 2 near-equal groups of at most GROUP_ROWS, each as a type (a tuple of its length),
    so numba compiles and caches one version per row count."""
    if rows <= GROUP_ROWS:
        return ((0,) * rows,)
    first = (rows + 1) // 2
    return (0,) * first, (0,) * (rows - first)


_ROW_TAGS = {rows: _row_groups(rows) for rows in range(1, MAX_ROWS + 1)}


@intrinsic
def _stack_tile(typingctx, row_tag):
    """A float32[len(row_tag) * BLOCK] scratch on the stack: unlike a heap array, LLVM keeps it in registers."""
    if not isinstance(row_tag, types.UniTuple):
        return None
    size = row_tag.count * BLOCK

    def codegen(context, builder, signature, args):
        return cgutils.alloca_once(builder, context.get_value_type(types.float32), size=size)

    return types.CPointer(types.float32)(row_tag), codegen


PREFETCH_AHEAD = 64
"""Weight rows (k) ahead of the FMAs that prefetching calls prefetch (into L2). Without it, on an Intel Xeon
(AVX-512 + AMX) host the hardware prefetcher fell behind once a row's FMAs were added per weight: 2 / 5 rows cost
1.17x / 1.36x one row; with it 1.01x / 1.11x (benchmarks/results_row_gemv.md)."""
PREFETCH_MIN_ROWS = 1 if wide_vectors() else 2
"""Calls of at least this many rows prefetch. One-row calls do only on 512-bit vectors (a decode 2-4% faster there;
with 256-bit ones it made decodes 3-10% slower)."""


@intrinsic
def _prefetch(typingctx, packed, flat_index):
    """A prefetch hint (into L2) for ``packed``'s element at ``flat_index`` (C order); past the end is harmless."""
    if not isinstance(packed, types.Array):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        address = builder.gep(data, [args[1]])
        i32 = llvmlite.ir.IntType(32)
        hint = cgutils.get_or_insert_function(
            builder.module, llvmlite.ir.FunctionType(llvmlite.ir.VoidType(), [address.type, i32, i32, i32]),
            "llvm.prefetch.p0")
        builder.call(hint, [address, i32(0), i32(2), i32(1)])  # read, locality 2 (L2), data cache
        return context.get_dummy_value()

    return types.none(packed, types.intp), codegen


@numba.njit(inline="always", nogil=True)
def _prefetch_row(packed, b, k, rows):
    """From PREFETCH_MIN_ROWS rows: prefetch weight row k + PREFETCH_AHEAD of block b (else a compile-time no-op)."""
    if rows >= PREFETCH_MIN_ROWS:
        ahead = (b * packed.shape[1] + k + PREFETCH_AHEAD) * BLOCK
        for offset in range(0, BLOCK, 64 // packed.itemsize):  # one hint per 64-byte line (int8 rows: one)
            _prefetch(packed, ahead + offset)


@numba.njit(inline="always", nogil=True, fastmath={"contract"})  # contract: x*w + acc is one FMA
def _block(x, first_row, packed, b, split, out, row_tag):
    """For rows first_row .. first_row + len(row_tag) - 1 and block b: out[r, b*BLOCK + j] = sum_{k<split} x[r, k]
    w[k] + sum_{k>=split} x[r, k] w[k], each sum one in-order FMA chain."""
    rows = len(row_tag)
    in_features = packed.shape[1]
    head = numba.carray(_stack_tile(row_tag), (rows, BLOCK))
    tail = numba.carray(_stack_tile(row_tag), (rows, BLOCK))
    for r in range(rows):
        for j in range(BLOCK):
            head[r, j] = 0.0
            tail[r, j] = 0.0
    for k in range(split):
        _prefetch_row(packed, b, k, rows)
        for r in range(rows):
            xk = x[first_row + r, k]
            for j in range(BLOCK):
                head[r, j] += xk * numba.float32(packed[b, k, j])  # int8 -> float32: exact
    for k in range(split, in_features):
        _prefetch_row(packed, b, k, rows)
        for r in range(rows):
            xk = x[first_row + r, k]
            for j in range(BLOCK):
                tail[r, j] += xk * numba.float32(packed[b, k, j])
    for r in range(rows):
        for j in range(BLOCK):
            out[first_row + r, b * BLOCK + j] = head[r, j] + tail[r, j]


@numba.njit(parallel=True, cache=True, nogil=True, fastmath={"contract"})
def _gemm(x, packed, split, out, row_tag):
    """x [M, K] @ the packed weight -> out [M, blocks * BLOCK], M = len(row_tag) <= GROUP_ROWS."""
    for b in numba.prange(packed.shape[0]):
        _block(x, 0, packed, b, split, out, row_tag)


@numba.njit(parallel=True, cache=True, nogil=True, fastmath={"contract"})
def _gemm_two_groups(x, packed, split, out, first_tag, second_tag):
    """``_gemm`` for M = len(first_tag) + len(second_tag) rows: both groups per block, the second from cache."""
    for b in numba.prange(packed.shape[0]):
        _block(x, 0, packed, b, split, out, first_tag)
        _block(x, len(first_tag), packed, b, split, out, second_tag)


def precompile() -> None:
    """Compile (or load from numba's disk cache) the kernel for every row count and both weight dtypes, so no
    run pays a first-use compile (~1 s per row count) in the middle of its measured steps. `make install` runs it."""
    for dtype in (torch.float32, torch.int8):
        packed = pack_blocks(torch.zeros(BLOCK, SPLIT_STEP, dtype=dtype))
        for rows in range(1, MAX_ROWS + 1):
            gemm_rows(torch.zeros(rows, SPLIT_STEP), packed, SPLIT_STEP)


if __name__ == "__main__":
    precompile()
