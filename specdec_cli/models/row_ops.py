"""The per-row, non-GEMM parts of a decoder layer as compiled passes (CPU, float32): what sits between the GEMMs.

At batch 1 a decoder layer's GEMMs stream the weights from memory and everything between them is a handful of
tiny ops, each paying torch's dispatch with its code gone cold from the caches the weights just went through:
``F.rms_norm`` (five ATen ops on CPU) took 44 us a call inside a decode, 2.7 of its 38 ms over SmolLM2-135M's
61 norms; RoPE and the two K/V cache writes another ~1.5 ms, the attention of the new row ~3.4 ms. Here one numba
call does each:

- ``rms_norm`` / ``add_rms_norm``: the norm (and the residual add ``h = x + delta`` before it). Each row's mean
  square is summed in float64 in a fixed order, with no fast-math, so a row's result depends only on that row:
  the same decoded alone, verified among K+1 tokens or prefilled in a chunk of 512, serial or spread over
  threads. It can round an ulp apart from ``F.rms_norm``, so a process takes this path for every CPU float32
  norm (``layers.RMSNorm``).
- ``rope_store``: RoPE on q and k and the K/V writes into the slot cache; elementwise and without fast-math,
  bit for bit what ``rope.apply_rotary`` and the indexed writes compute.
- ``attend_rows``: one request's decode / verify / tree rows over its slot (``attention.attend_requests``). Each
  row's scores, softmax and weighted sum run over its own keys in the order of one compiled function, so a
  row's output does not depend on how many rows came with it; as accurate as the GEMM path (about 1e-6 from a
  float64 reference for 300 keys), which long prefill chunks keep.

This module imports numba at the top: import it lazily and keep torch where that fails.
"""
from __future__ import annotations

from typing import Optional

import llvmlite.ir
import numba
import numpy as np
import torch
from numba.core import types
from numba.extending import intrinsic

from specdec_cli.numba_setup import use_wide_vectors

use_wide_vectors()

PARALLEL_MIN_ROWS = 32
"""From this many rows (prefill chunks) the rows are spread over torch's thread count; fewer run serially
(a decode's one row would pay more to wake a thread than the norm costs)."""


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., H] float32 (CPU) -> weight * x / sqrt(mean(x^2) + eps) per row, [..., H] float32."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty_like(rows)
    _norm_kernel(rows.shape[0])(rows.numpy(), rows.numpy(), False, weight.detach().numpy(), np.float32(eps),
                           rows.numpy(), out.numpy())
    return out.view(x.shape)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + delta and rms_norm(h), both [..., H] float32 (CPU), in one pass (a decoder layer's residual)."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    deltas = delta.reshape(rows.shape).contiguous()
    h, out = torch.empty_like(rows), torch.empty_like(rows)
    _norm_kernel(rows.shape[0])(rows.numpy(), deltas.numpy(), True, weight.detach().numpy(), np.float32(eps),
                           h.numpy(), out.numpy())
    return h.view(x.shape), out.view(x.shape)


def rope_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, slot_ids: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, KV, D] (views of one projection are fine), cos/sin [T, 1, D/2] -> rotated q [T, Hq, D];
    writes rotated k and v at (slot_ids[t], positions[t]) of k_cache/v_cache [slots, KV, max_len, D]."""
    out = torch.empty(q.shape, dtype=q.dtype, device="cpu")
    kernel = _rope_rows_parallel if q.shape[0] >= PARALLEL_MIN_ROWS and torch.get_num_threads() > 1 else _rope_rows
    kernel(q.numpy(), k.numpy(), v.numpy(), cos.reshape(q.shape[0], -1).numpy(), sin.reshape(q.shape[0], -1).numpy(),
           k_cache.numpy(), v_cache.numpy(), slot_ids.numpy(), positions.numpy(), out.numpy())
    return out


FAST = {"reassoc", "contract"}
"""``_attend``'s fast-math: LLVM may vectorise its sums and fuse multiply-adds (no assumption about inf/NaN: masked
keys are -inf). It is one compiled function, run for every row alike, so its fixed order stays row-invariant."""
ATTEND_MAX_ROWS = 80
"""Most new rows of one request that ``attend_rows`` takes (every decode and verify: at most a 64-node tree plus
its root); longer prefill chunks keep the batched GEMM attention, which is faster there."""


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float,
                visible: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Softmax attention of one request's n new rows: q [n, Hq, D] (rotated) over its slot's keys/values
    k, v [KV, >= start + n, D] (C-contiguous), the new rows at positions start .. start + n - 1 -> [n, Hq, D].
    Row i sees keys 0 .. start + i (causal), of those only where ``visible`` [n, start + n] bool (tree rows) is
    True. GQA: head h reads KV head h // (Hq / KV). Row-invariant (see the module doc)."""
    out = torch.empty(q.shape, dtype=q.dtype, device="cpu")
    mask = _NO_MASK if visible is None else visible.numpy()
    _attend(q.contiguous().numpy(), k.numpy(), v.numpy(), start, np.float32(scale), mask, visible is not None,
            out.numpy())
    return out


_NO_MASK = np.ones((1, 1), dtype=np.bool_)


def _norm_kernel(rows: int):
    return _norm_rows_parallel if rows >= PARALLEL_MIN_ROWS and torch.get_num_threads() > 1 else _norm_rows


@numba.njit(inline="always", nogil=True)
def _norm_row(x, delta, add, weight, eps, h, out, r):
    """Row r: h = x + delta (when ``add``; else h is x), out = weight * (h * (1 / sqrt(mean(h^2) + eps))), the mean
    from a float64 sum (four interleaved partial sums, element i in sum i % 4: shorter dependency chains; then
    those in order) rounded once to float32."""
    size = x.shape[1]
    s0, s1, s2, s3 = 0.0, 0.0, 0.0, 0.0
    for i in range(size):
        value = x[r, i] + delta[r, i] if add else x[r, i]
        if add:
            h[r, i] = value
        square = np.float64(value) * np.float64(value)  # exact in float64
        lane = i % 4
        if lane == 0:
            s0 += square
        elif lane == 1:
            s1 += square
        elif lane == 2:
            s2 += square
        else:
            s3 += square
    mean = np.float32((((s0 + s1) + s2) + s3) / size)
    inverse = np.float32(1.0) / np.sqrt(mean + eps)
    for i in range(size):
        out[r, i] = weight[i] * (h[r, i] * inverse)


@numba.njit(nogil=True, cache=True)
def _norm_rows(x, delta, add, weight, eps, h, out):
    for r in range(x.shape[0]):
        _norm_row(x, delta, add, weight, eps, h, out, r)


@numba.njit(parallel=True, nogil=True, cache=True)
def _norm_rows_parallel(x, delta, add, weight, eps, h, out):
    for r in numba.prange(x.shape[0]):
        _norm_row(x, delta, add, weight, eps, h, out, r)


@numba.njit(inline="always", nogil=True)
def _rotate(x, cos, sin, out):
    """x [D] rotated (rotate-half: [x1 cos - x2 sin, x2 cos + x1 sin]) by cos/sin [D/2] into out [D]."""
    half = cos.shape[0]
    for i in range(half):
        x1, x2 = x[i], x[i + half]
        out[i] = x1 * cos[i] - x2 * sin[i]
        out[i + half] = x2 * cos[i] + x1 * sin[i]


@numba.njit(inline="always", nogil=True)
def _rope_row(q, k, v, cos, sin, k_cache, v_cache, slot_ids, positions, out, t):
    """Row t: its q heads rotated into out[t], its k heads rotated and v heads copied into the cache."""
    slot, position = slot_ids[t], positions[t]
    for h in range(q.shape[1]):
        _rotate(q[t, h], cos[t], sin[t], out[t, h])
    for h in range(k.shape[1]):
        _rotate(k[t, h], cos[t], sin[t], k_cache[slot, h, position])
        v_cache[slot, h, position, :] = v[t, h]


@numba.njit(nogil=True, cache=True)
def _rope_rows(q, k, v, cos, sin, k_cache, v_cache, slot_ids, positions, out):
    for t in range(q.shape[0]):
        _rope_row(q, k, v, cos, sin, k_cache, v_cache, slot_ids, positions, out, t)


@numba.njit(parallel=True, nogil=True, cache=True)
def _rope_rows_parallel(q, k, v, cos, sin, k_cache, v_cache, slot_ids, positions, out):
    for t in numba.prange(q.shape[0]):
        _rope_row(q, k, v, cos, sin, k_cache, v_cache, slot_ids, positions, out, t)


@intrinsic
def _float32_from_bits(typingctx, bits):
    """The float32 whose IEEE bits are the int32 ``bits`` (a bit cast, vectorisable)."""
    if bits != types.int32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvmlite.ir.FloatType())

    return types.float32(types.int32), codegen


@numba.njit(inline="always", nogil=True, fastmath=FAST)
def _exp(x):
    """exp(x) for float32 x <= 0 (a score minus its row's max), within 2 ulp; exactly 0 at -inf and below -87.
    Cephes' expf (x = n ln2 + r, a degree-6 polynomial in r, times 2^n by the exponent bits): no libm call, so
    LLVM vectorises the loop around it (libm's expf, one call per score, made long contexts slower than torch)."""
    clamped = max(x, np.float32(-87.0))
    n = np.floor(clamped * np.float32(1.44269504088896341) + np.float32(0.5))
    r = clamped - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    scaled = p * _float32_from_bits(np.int32((np.int32(n) + np.int32(127)) << np.int32(23)))
    return scaled if x > np.float32(-87.0) else np.float32(0.0)


@numba.njit(parallel=True, nogil=True, cache=True, fastmath=FAST)
def _attend(q, k, v, start, scale, visible, masked, out):
    """See ``attend_rows``: one (row, head) pair per parallel item, each the same code whatever the rows and thread
    count; float32 scores, exponentials and weighted values, the normaliser in float64."""
    rows, heads, dim = q.shape
    groups = heads // k.shape[0]
    for item in numba.prange(rows * heads):
        i, h = item // heads, item % heads
        g, keys = h // groups, start + i + 1  # causal; a tree row's mask also hides the other branches
        weights = np.empty(keys, dtype=np.float32)
        top = np.float32(-np.inf)
        for j in range(keys):
            score = np.float32(0.0)
            for d in range(dim):
                score += q[i, h, d] * k[g, j, d]
            score *= scale
            if masked and not visible[i, j]:
                score = np.float32(-np.inf)
            weights[j] = score
            top = max(top, score)
        total = 0.0
        for j in range(keys):
            weight = _exp(weights[j] - top)  # 0 for hidden keys (-inf)
            weights[j] = weight
            total += weight
        mixed = np.zeros(dim, dtype=np.float32)
        for j in range(keys):
            weight = weights[j]
            for d in range(dim):
                mixed[d] += weight * v[g, j, d]
        for d in range(dim):
            out[i, h, d] = mixed[d] / total


def precompile() -> None:
    """Compile (or load from numba's disk cache) every kernel, serial and parallel, for the layouts a model passes."""
    cpu = dict(device="cpu")
    x, ones = torch.ones(PARALLEL_MIN_ROWS, 8, **cpu), torch.ones(PARALLEL_MIN_ROWS, 8, **cpu)
    qkv = torch.ones(PARALLEL_MIN_ROWS, 4, 8, **cpu)
    cache = torch.zeros(1, 1, PARALLEL_MIN_ROWS, 8, **cpu)
    for rows in (1, PARALLEL_MIN_ROWS):
        rms_norm(x[:rows], ones[0], 1e-5)
        add_rms_norm(x[:rows], x[:rows], ones[0], 1e-5)
        q, k, v = qkv[:rows].split([2, 1, 1], dim=1)
        angles = ones[:rows, None, :4]
        rope_store(q, k, v, angles, angles, cache, cache.clone(), torch.zeros(rows, dtype=torch.int64, **cpu),
                   torch.arange(rows, **cpu))
        attend_rows(q, cache[0], cache[0], 0, 1.0)
        attend_rows(q, cache[0], cache[0], 0, 1.0, torch.ones(rows, rows, dtype=torch.bool, **cpu))

if __name__ == "__main__":
    precompile()
