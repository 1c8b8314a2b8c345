"""Random draws with per-row streams: uniforms and inverse-CDF sampling.

Each row consumes a fixed number of float64 uniforms from its own generator, so a seeded row's draws depend
only on its generator and its own probabilities, never on the rest of the batch. A token is drawn by inverse
CDF with one uniform: ``token = first j with cumsum(w)[j] > u * sum(w)``. A one-hot row therefore returns
its argmax exactly and a zero-weight token is never returned. Chunk masses are float32 sums of at most 256
tokens and every cumulative sum is float64, so no token loses its mass to rounding (a float32 cumsum over a
128k vocabulary silently drops tokens below about 6e-8).

The scan is two-level so that the rows are read from memory once: a first pass computes the mass of every
256-token chunk, the uniform picks a chunk, and only that chunk is re-read to pick the token. On CPU the first
pass runs entry by entry through two one-row buffers that stay in cache (each row is read from memory once, and
no batch-sized copy is made); on accelerators it runs over the whole batch.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from specdec_cli.sampling.probs import SamplingError

Generators = Union[torch.Generator, Sequence[Optional[torch.Generator]], None]
"""None (the default RNG), one generator for the whole batch, or one (possibly None) generator per row."""

# Chunk width of the two-level scan on CPU. The chunk is fixed and a chunk's sum depends only on its own row,
# so a row's draw never depends on the rest of the batch. On accelerators one chunk spans the vocabulary.
CPU_CHUNK = 256


def draw_uniforms(
    shape_per_row: tuple[int, ...], generators: Generators, *, num_rows: int, device: torch.device | str
) -> torch.Tensor:
    """U[0, 1) float64 of shape [num_rows, *shape_per_row].

    With a per-row list, row i is drawn from ``generators[i]`` alone (the default RNG where it is None),
    which is what makes seeded rows batch-invariant. One generator or None draws the batch in one call.
    A generator draws on its own device (the engine creates them on the model's device; a CPU generator
    with CUDA probs draws on the host and the row is copied once).
    """
    shape = (num_rows, *shape_per_row)
    if generators is None:
        return torch.rand(shape, dtype=torch.float64, device=device)
    if isinstance(generators, torch.Generator):
        return torch.rand(shape, generator=generators, dtype=torch.float64, device=generators.device).to(device)
    if len(generators) != num_rows:
        raise SamplingError(f"got {len(generators)} generators for {num_rows} rows")
    uniforms = torch.rand(shape, dtype=torch.float64, device=device)
    for row, generator in enumerate(generators):
        if generator is not None:
            uniforms[row] = torch.rand(shape_per_row, generator=generator, dtype=torch.float64,
                                       device=generator.device)
    return uniforms


def sample_from_probs(probs: torch.Tensor, generators: Generators = None) -> torch.Tensor:
    """probs [N, V] (non-negative, need not be normalised) -> tokens [N] int64, one uniform per row."""
    if probs.dim() != 2:
        raise SamplingError(f"probs must be [N, V], got {tuple(probs.shape)}")
    num_rows = probs.shape[0]
    uniforms = draw_uniforms((), generators, num_rows=num_rows, device=probs.device)
    first_row = torch.zeros(num_rows, dtype=torch.int64, device=probs.device)
    return sample_target_or_residual(probs[:, None, :], first_row, uniforms)


def sample_target_or_residual(
    target_probs: torch.Tensor,
    target_row: torch.Tensor,
    uniforms: torch.Tensor,
    draft_probs: Optional[torch.Tensor] = None,
    draft_row: Optional[torch.Tensor] = None,
    use_residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One inverse-CDF draw per batch entry -> tokens [B] int64.

    target_probs [B, R, V], target_row [B] and uniforms [B] float64: entry b draws from
    ``target_probs[b, target_row[b]]``. With draft_probs [B, R', V], draft_row [B] and use_residual [B] bool,
    entries with use_residual draw from the recovery residual ``max(target - draft, 0)`` of those rows
    instead, or from the target row when the residual is numerically empty (all zero).
    Contiguous and ``expand``ed inputs are read in place (other layouts are copied once); no host sync.
    """
    batch, _, vocab = target_probs.shape
    device = target_probs.device
    chunk = min(vocab, CPU_CHUNK) if device.type == "cpu" else vocab
    target = _Rows.of(target_probs, target_row)
    draft = None if draft_probs is None else _Rows.of(draft_probs, draft_row)

    # Pass 1: float32 masses [B, chunks] of every chunk of each entry's row (its residual where it is on).
    chunks = _chunk_masses_by_row if device.type == "cpu" else _chunk_masses_by_batch
    mass, residual_on = chunks(target, draft, use_residual, vocab, chunk)

    # Pass 2: the uniform picks a chunk, then a token inside it against the chunk's float64 cumulative sum.
    mass = mass.double()
    chunk_cdf = mass.cumsum(dim=-1)
    needle = uniforms * chunk_cdf[:, -1]
    picked = _first_above(chunk_cdf, needle)
    rows = torch.arange(batch, device=device)
    mass_before = F.pad(chunk_cdf, (1, 0))[rows, picked]
    fraction = (needle - mass_before) / mass[rows, picked].clamp(min=torch.finfo(torch.float64).tiny)
    # A last, partial chunk is read as the chunk-wide window ending at V, the chunk before it zeroed.
    start = (picked * chunk).clamp(max=vocab - chunk)
    before_chunk = start[:, None] + torch.arange(chunk, device=device) < picked[:, None] * chunk
    weights = target.window(start, chunk).double()
    if draft is not None:
        draft_window = draft.window(start, chunk).double()
        weights = torch.where(residual_on[:, None], (weights - draft_window).clamp_(min=0), weights)
    cdf = weights.masked_fill_(before_chunk, 0.0).cumsum(dim=-1)
    return start + _first_above(cdf, fraction * cdf[:, -1])


def _chunk_masses_by_row(
    target: _Rows, draft: Optional[_Rows], use_residual: Optional[torch.Tensor], vocab: int, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU: (masses [B, chunks], residual_on [B]), one entry at a time through two one-row buffers.

    Each entry's target (and draft) row is copied into a buffer that stays in cache while it is summed,
    subtracted, clamped and summed again, so every row is read from memory once; no host reads.
    """
    batch, num_chunks = target.index.numel(), -(-vocab // chunk)
    target_mass = target.flat.new_empty(batch, num_chunks)
    residual_mass = None if draft is None else torch.empty_like(target_mass)
    buffers = target.flat.new_zeros(2, num_chunks * chunk)  # the tails past V stay zero (a ragged last chunk)
    target_row, draft_row = buffers[0, :vocab][None], buffers[1, :vocab][None]
    for entry in range(batch):
        torch.index_select(target.flat, 0, target.index[entry : entry + 1], out=target_row)
        torch.sum(buffers[0].view(num_chunks, chunk), dim=-1, out=target_mass[entry])
        if draft is not None:
            torch.index_select(draft.flat, 0, draft.index[entry : entry + 1], out=draft_row)
            torch.sub(target_row, draft_row, out=draft_row).clamp_(min=0)
            torch.sum(buffers[1].view(num_chunks, chunk), dim=-1, out=residual_mass[entry])
    if draft is None:
        return target_mass, torch.zeros(batch, dtype=torch.bool, device=target_mass.device)
    residual_on = use_residual & (residual_mass.sum(dim=-1) > 0)
    return torch.where(residual_on[:, None], residual_mass, target_mass), residual_on


def _chunk_masses_by_batch(
    target: _Rows, draft: Optional[_Rows], use_residual: Optional[torch.Tensor], vocab: int, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accelerators: (masses [B, chunks], residual_on [B]) for the whole batch at once, without a host sync."""
    everyone = slice(None)
    target_rows = target.rows(everyone)
    mass = _chunk_sums(target_rows, chunk)
    residual_on = torch.zeros(target.index.numel(), dtype=torch.bool, device=mass.device)
    if draft is not None:
        draft_rows = draft.rows(everyone)
        residual = _chunk_sums(torch.sub(target_rows, draft_rows, out=draft_rows).clamp_(min=0), chunk)
        residual_on = use_residual & (residual.sum(dim=-1) > 0)
        mass = torch.where(residual_on[:, None], residual, mass)
    return mass, residual_on


class _Rows(NamedTuple):
    """Row b of a [B, R, V] tensor at position row[b], read without materialising the rows."""

    flat: torch.Tensor  # [B * R, V], a view for contiguous and expanded layouts
    index: torch.Tensor  # [B] row of batch entry b in `flat`

    @classmethod
    def of(cls, probs: torch.Tensor, row: torch.Tensor) -> "_Rows":
        batch, positions, vocab = probs.shape
        return cls(probs.reshape(batch * positions, vocab), torch.arange(batch, device=probs.device) * positions + row)

    def rows(self, entries: slice) -> torch.Tensor:
        """The rows of batch entries ``entries`` -> a fresh contiguous [n, V] tensor."""
        return self.flat.index_select(0, self.index[entries])

    def window(self, start: torch.Tensor, width: int) -> torch.Tensor:
        """Columns start[b] .. start[b] + width of row b -> a fresh [B, width] tensor."""
        return self.flat.unfold(-1, width, 1)[self.index, start]


def _chunk_sums(part: torch.Tensor, chunk: int) -> torch.Tensor:
    """part [N, V] -> sums over consecutive chunks of `chunk` columns [N, ceil(V / chunk)]."""
    pad = -part.shape[-1] % chunk
    if pad:  # a vocabulary that is not a multiple of the chunk: the last chunk is zero-padded
        part = F.pad(part, (0, pad))
    return part.view(part.shape[0], part.shape[-1] // chunk, chunk).sum(dim=-1)


def _first_above(cdf: torch.Tensor, needle: torch.Tensor) -> torch.Tensor:
    """cdf [N, M] non-decreasing, needle [N] -> [N]: first index with cdf > needle.

    When rounding puts the needle at or past the total, the last positive-weight index is returned instead
    (the first index whose cdf reaches the total), so a zero-weight index is never picked.
    """
    index = torch.searchsorted(cdf, needle[:, None], right=True)
    last_positive = torch.searchsorted(cdf, cdf[:, -1:].contiguous(), right=False)
    return torch.minimum(index, last_positive)[:, 0]
