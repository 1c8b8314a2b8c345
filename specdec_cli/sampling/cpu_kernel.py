"""The fused CPU draw: gather, residual, chunk masses and the inverse-CDF pick in one compiled pass per row.

``draw_rows`` is what ``sample_target_or_residual`` runs on CPU. Row b reads its target row (and its draft row
where it draws from the recovery residual) from memory once: pass 1 sums ``CHUNK``-token chunks of the weights
(float64, the residual ``max(s * target - draft, 0)`` computed in float64, s = 1 unless a scale is given: block
verification's w_i), pass 2 walks the chunk masses and then
the one picked chunk, still in cache, to the first token whose float64 cumulative weight exceeds
``u * total``. Rows are independent (one row is one thread's work, in a fixed summation order), so a row's
token depends only on its own probabilities and uniform, never on the batch or the thread count.

The kernel is compiled with numba (a dependency; ``cache=True`` keeps the machine code next to this file).
This module imports numba at the top: callers import it lazily and run their batched torch path where that
import fails.
"""
from __future__ import annotations

from typing import Optional

import numba
import numpy as np
import torch

from specdec_cli.numba_setup import use_wide_vectors

use_wide_vectors()

CHUNK = 256
"""Tokens per chunk of pass 1 (a chunk's mass depends only on its own row)."""
PARALLEL_MIN_ENTRIES = 32 * 49_152
"""From this many weights (rows x V) the rows are spread over torch's thread count (about 1 ms of work); below
it the serial kernel runs, as waking a second thread pool next to torch's costs more than it saves."""
_DTYPES = (torch.float32, torch.float64)


def usable(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether these probability tensors can go to the kernel: CPU, float32/float64, unit stride over V."""
    return all(
        t is None or (t.device.type == "cpu" and t.dtype in _DTYPES and t.stride(-1) == 1) for t in tensors
    )


def draw_rows(
    target_flat: torch.Tensor,
    target_index: torch.Tensor,
    uniforms: torch.Tensor,
    draft_flat: Optional[torch.Tensor] = None,
    draft_index: Optional[torch.Tensor] = None,
    use_residual: Optional[torch.Tensor] = None,
    target_scale: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One draw per entry -> tokens [B] int64.

    target_flat [N, V] and target_index [B]: entry b draws from row ``target_index[b]``; with draft_flat [N', V],
    draft_index [B] and use_residual [B] bool, entries with use_residual draw from
    ``max(s_b * target - draft, 0)`` of their two rows (s_b = target_scale[b], float64, default 1), or from the
    target row when that residual is all zero. uniforms [B] float64 in [0, 1). Read in place (no copy).
    """
    batch = target_index.numel()
    if draft_flat is None:  # no residual anywhere: the target row stands in for the draft row (never read)
        draft_flat, draft_index = target_flat, target_index
        use_residual = torch.zeros(batch, dtype=torch.bool, device=target_flat.device)
    tokens = np.empty(batch, dtype=np.int64)
    _pick(_draw_rows, _draw_rows_parallel, batch, target_flat)(
        _array(target_flat), _array(target_index), _array(draft_flat), _array(draft_index),
        _array(use_residual), _scales(target_scale, batch), _array(uniforms.to(torch.float64)), CHUNK, tokens,
    )
    return torch.from_numpy(tokens)


def residual_masses(target_flat: torch.Tensor, target_index: torch.Tensor, draft_flat: torch.Tensor,
                    draft_index: torch.Tensor, target_scale: torch.Tensor) -> torch.Tensor:
    """Entry b's float64 ``sum_v max(s_b * target_flat[target_index[b], v] - draft_flat[draft_index[b], v], 0)``
    (s_b = target_scale[b]) -> [B] float64, one pass over each row pair (block verification's m_i)."""
    batch = target_index.numel()
    masses = np.empty(batch, dtype=np.float64)
    _pick(_masses, _masses_parallel, batch, target_flat)(
        _array(target_flat), _array(target_index), _array(draft_flat), _array(draft_index),
        _scales(target_scale, batch), masses,
    )
    return torch.from_numpy(masses)


def _pick(serial, parallel, batch: int, target_flat: torch.Tensor):
    """The parallel kernel from PARALLEL_MIN_ENTRIES weights where torch has more than one thread, else serial."""
    if batch * target_flat.shape[-1] >= PARALLEL_MIN_ENTRIES and torch.get_num_threads() > 1:
        numba.set_num_threads(min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
        return parallel
    return serial


def _scales(target_scale: Optional[torch.Tensor], batch: int) -> np.ndarray:
    if target_scale is None:
        return np.ones(batch, dtype=np.float64)
    return np.ascontiguousarray(_array(target_scale.to(torch.float64)))


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().numpy()


_JIT = dict(cache=True, nogil=True, fastmath={"reassoc", "contract"})  # reassoc: vectorised chunk sums


@numba.njit(inline="always", **_JIT)
def _weight(target_row, draft_row, residual, scale, j):
    """The weight of token j: the target probability, or the float64 residual max(scale * target - draft, 0)."""
    weight = np.float64(target_row[j])
    if residual:
        weight = max(scale * weight - np.float64(draft_row[j]), 0.0)
    return weight


@numba.njit(inline="always", **_JIT)
def _residual_mass(target_chunk, draft_chunk, scale):
    """sum of max(scale * target - draft, 0) over one chunk (float64; scale 1 gives target - draft exactly).
    Slices, not index ranges, let LLVM vectorise."""
    mass = 0.0
    for j in range(target_chunk.shape[0]):
        mass += max(scale * np.float64(target_chunk[j]) - np.float64(draft_chunk[j]), 0.0)
    return mass


@numba.njit(inline="always", **_JIT)
def _target_mass(target_chunk):
    """sum of the target probabilities of one chunk (float64)."""
    mass = 0.0
    for j in range(target_chunk.shape[0]):
        mass += np.float64(target_chunk[j])
    return mass


@numba.njit(**_JIT)
def _draw_one(target_row, draft_row, residual, scale, uniform, chunk):
    """One row: pass 1 chunk masses (float64), pass 2 the chunk and then the token, by inverse CDF."""
    vocab = target_row.shape[0]
    num_chunks = (vocab + chunk - 1) // chunk
    masses = np.empty(num_chunks)
    for attempt in range(2):  # the residual, then the target row if that residual is all zero
        total = 0.0
        for c in range(num_chunks):
            start, stop = c * chunk, min(vocab, (c + 1) * chunk)
            if residual:
                mass = _residual_mass(target_row[start:stop], draft_row[start:stop], scale)
            else:
                mass = _target_mass(target_row[start:stop])
            masses[c] = mass
            total += mass
        if total > 0.0 or not residual:
            break
        residual = False
    needle = uniform * total
    # the chunk: first whose cumulative mass exceeds the needle (the last positive one if rounding says none)
    before, picked = 0.0, -1
    for c in range(num_chunks):
        if masses[c] > 0.0:
            picked = c
            if before + masses[c] > needle:
                break
            before += masses[c]
    if picked < 0:
        return 0  # an all-zero row (no valid distribution): the caller's inputs were invalid
    if before + masses[picked] <= needle:
        before -= masses[picked]  # fell off the end: walk the last positive chunk from its start
    # the token: first positive-weight token of the chunk whose cumulative weight exceeds the needle
    cumulative, last_positive = before, picked * chunk
    for j in range(picked * chunk, min(vocab, (picked + 1) * chunk)):
        weight = _weight(target_row, draft_row, residual, scale, j)
        if weight > 0.0:
            last_positive = j
            cumulative += weight
            if cumulative > needle:
                return j
    return last_positive


@numba.njit(**_JIT)
def _draw_rows(target_flat, target_index, draft_flat, draft_index, use_residual, scales, uniforms, chunk, tokens):
    """Serial kernel: every entry in order (see ``_draw_one``)."""
    for b in range(target_index.shape[0]):
        tokens[b] = _draw_one(target_flat[target_index[b]], draft_flat[draft_index[b]], use_residual[b],
                              scales[b], uniforms[b], chunk)


@numba.njit(parallel=True, **_JIT)
def _draw_rows_parallel(target_flat, target_index, draft_flat, draft_index, use_residual, scales, uniforms, chunk,
                        tokens):
    """Parallel kernel: entries spread over numba's thread pool, each entry still one thread's work."""
    for b in numba.prange(target_index.shape[0]):
        tokens[b] = _draw_one(target_flat[target_index[b]], draft_flat[draft_index[b]], use_residual[b],
                              scales[b], uniforms[b], chunk)


@numba.njit(**_JIT)
def _masses(target_flat, target_index, draft_flat, draft_index, scales, masses):
    """Serial kernel of ``residual_masses``."""
    for b in range(target_index.shape[0]):
        masses[b] = _residual_mass(target_flat[target_index[b]], draft_flat[draft_index[b]], scales[b])


@numba.njit(parallel=True, **_JIT)
def _masses_parallel(target_flat, target_index, draft_flat, draft_index, scales, masses):
    """Parallel kernel of ``residual_masses`` (each entry one thread's work, so the same sums as serial)."""
    for b in numba.prange(target_index.shape[0]):
        masses[b] = _residual_mass(target_flat[target_index[b]], draft_flat[draft_index[b]], scales[b])
