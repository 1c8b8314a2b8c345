"""Random draws with per-row streams: uniforms and inverse-CDF sampling.

Each row consumes a fixed number of float64 uniforms from its own generator, so a seeded row's draws depend
only on its generator and its own probabilities, never on the rest of the batch. A token is drawn by inverse
CDF with one uniform: ``token = first j with cumsum(w)[j] > u * sum(w)``. A one-hot row therefore returns
its argmax exactly and a zero-weight token is never returned. Every cumulative sum is float64, so no token
loses its mass to rounding (a float32 cumsum over a 128k vocabulary silently drops tokens below about 6e-8).

On CPU the draw is one fused, compiled pass per row (``cpu_kernel``: each row read from memory once, no copy);
on accelerators, or where numba cannot be imported, the same draw runs over the whole batch in torch.
"""
from __future__ import annotations

import functools
from types import ModuleType
from typing import NamedTuple, Optional, Sequence, Union

import torch

from specdec_cli.sampling.probs import SamplingError

Generators = Union[torch.Generator, Sequence[Optional[torch.Generator]], None]
"""None (the default RNG), one generator for the whole batch, or one (possibly None) generator per row."""


@functools.cache
def _cpu_kernel() -> Optional[ModuleType]:
    """The fused CPU kernel module (``cpu_kernel``), or None where numba cannot be imported."""
    try:
        from specdec_cli.sampling import cpu_kernel
    except ImportError:
        return None
    return cpu_kernel


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
    target_scale: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One inverse-CDF draw per batch entry -> tokens [B] int64.

    target_probs [B, R, V], target_row [B] and uniforms [B] float64: entry b draws from
    ``target_probs[b, target_row[b]]``. With draft_probs [B, R', V], draft_row [B] and use_residual [B] bool,
    entries with use_residual draw from the recovery residual ``max(s_b * target - draft, 0)`` of those rows
    instead (s_b = target_scale[b] float64, default 1: block verification's weight), or from the target row
    when the residual is numerically empty (all zero).
    Contiguous and ``expand``ed inputs are read in place (other layouts are copied once); no host sync.
    """
    target = _Rows.of(target_probs, target_row)
    draft = None if draft_probs is None else _Rows.of(draft_probs, draft_row)
    kernel = _cpu_kernel()
    if kernel is not None and kernel.usable(target_probs, draft_probs):
        if draft is None:
            return kernel.draw_rows(target.flat, target.index, uniforms)
        return kernel.draw_rows(target.flat, target.index, uniforms, draft.flat, draft.index, use_residual,
                                target_scale)
    # Elsewhere (accelerators, or no numba): the whole batch at once, float64 weights, no host sync.
    weights = target.rows().double()
    if draft is not None:
        scaled = weights if target_scale is None else weights * target_scale.to(weights)[:, None]
        residual = (scaled - draft.rows().double()).clamp_(min=0)
        residual_on = use_residual & (residual.sum(dim=-1) > 0)
        weights = torch.where(residual_on[:, None], residual, weights)
    cdf = weights.cumsum(dim=-1)
    return _first_above(cdf, uniforms * cdf[:, -1])


def residual_masses(target_probs: torch.Tensor, draft_probs: torch.Tensor, rows: torch.Tensor,
                    target_scale: torch.Tensor) -> torch.Tensor:
    """target_probs [B, R, V], draft_probs [B, R', V], rows [M] int64, target_scale [B, M] -> [B, M] float64:
    ``sum_v max(target_scale[b, m] * target_probs[b, rows[m], v] - draft_probs[b, rows[m], v], 0)`` in float64
    (block verification's masses). On CPU one compiled pass per row pair, read in place; elsewhere in torch."""
    batch, num = target_scale.shape
    kernel = _cpu_kernel()
    if kernel is not None and kernel.usable(target_probs, draft_probs) and batch * num:
        target, draft = _Rows.of(target_probs, rows.expand(batch, -1)), _Rows.of(draft_probs, rows.expand(batch, -1))
        masses = kernel.residual_masses(target.flat, target.index.flatten(), draft.flat, draft.index.flatten(),
                                        target_scale.flatten())
        return masses.view(batch, num)
    scaled = target_scale.to(target_probs.device, torch.float64)[..., None] * target_probs[:, rows].double()
    return (scaled - draft_probs[:, rows].double()).clamp_(min=0).sum(dim=-1)


class _Rows(NamedTuple):
    """Row b of a [B, R, V] tensor at position row[b] (row [B], or [B, M] for M rows per entry), read without
    materialising the rows."""

    flat: torch.Tensor  # [B * R, V], a view for contiguous and expanded layouts
    index: torch.Tensor  # [B] (or [B, M]) row(s) of batch entry b in `flat`

    @classmethod
    def of(cls, probs: torch.Tensor, row: torch.Tensor) -> "_Rows":
        batch, positions, vocab = probs.shape
        entries = torch.arange(batch, device=probs.device).view(-1, *([1] * (row.dim() - 1)))
        return cls(probs.reshape(batch * positions, vocab), entries * positions + row)

    def rows(self) -> torch.Tensor:
        """Every entry's row -> a fresh contiguous [B, V] tensor."""
        return self.flat.index_select(0, self.index)


def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """weights [B, V] float64 >= 0, uniforms [B] -> [B]: first index whose cumulative weight exceeds
    u * total (never a zero-weight index)."""
    cdf = weights.cumsum(dim=-1)
    return _first_above(cdf, uniforms * cdf[:, -1])


def _first_above(cdf: torch.Tensor, needle: torch.Tensor) -> torch.Tensor:
    """cdf [N, M] non-decreasing, needle [N] -> [N]: first index with cdf > needle.

    When rounding puts the needle at or past the total, the last positive-weight index is returned instead
    (the first index whose cdf reaches the total), so a zero-weight index is never picked.
    """
    index = torch.searchsorted(cdf, needle[:, None], right=True)
    last_positive = torch.searchsorted(cdf, cdf[:, -1:].contiguous(), right=False)
    return torch.minimum(index, last_positive)[:, 0]
