"""Per-row sampling parameters of one batch, as tensors: built once per step, read by everyone.

The target (first-token and per-position sampling), the drafters (draft-side filters) and acceptance all
read the same ``BatchParams``; nobody else turns per-request temperature/top_k/top_p into tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

import torch


class RowSampling(Protocol):
    """What a row's sampling settings provide (e.g. the engine's ``SamplingParams``)."""

    temperature: float
    top_k: int
    top_p: float


class SampledRow(Protocol):
    """One row of a batch: its settings and its random stream (e.g. the engine's ``Request``)."""

    params: RowSampling
    generator: Optional[torch.Generator]


@dataclass(frozen=True)
class BatchParams:
    """temperature [B] float32 (0 = greedy), top_k [B] int64 (<= 0 off), top_p [B] float32 (1 off),
    generators: one (possibly None) torch.Generator per row; ``all_greedy`` is computed once."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    generators: tuple[Optional[torch.Generator], ...]
    all_greedy: bool

    @classmethod
    def of(cls, rows: Sequence[SampledRow], device: torch.device | str = "cpu") -> "BatchParams":
        """From the batch's rows (requests), in batch order."""
        return cls.from_values([r.params.temperature for r in rows], [r.params.top_k for r in rows],
                               [r.params.top_p for r in rows], [r.generator for r in rows], device)

    @classmethod
    def from_values(cls, temperature: Sequence[float], top_k: Sequence[int], top_p: Sequence[float],
                    generators: Sequence[Optional[torch.Generator]],
                    device: torch.device | str = "cpu") -> "BatchParams":
        """From per-row Python values (one entry per row, rows in batch order)."""
        return cls(
            temperature=torch.tensor(list(temperature), dtype=torch.float32, device=device),
            top_k=torch.tensor(list(top_k), dtype=torch.int64, device=device),
            top_p=torch.tensor(list(top_p), dtype=torch.float32, device=device),
            generators=tuple(generators),
            all_greedy=all(t == 0 for t in temperature),
        )

    def __len__(self) -> int:
        return len(self.generators)

    def select(self, rows: Sequence[int]) -> "BatchParams":
        """The sub-batch of ``rows`` (in that order)."""
        index = torch.tensor(list(rows), dtype=torch.int64, device=self.temperature.device)
        temperature = self.temperature.index_select(0, index)
        return BatchParams(
            temperature=temperature, top_k=self.top_k.index_select(0, index), top_p=self.top_p.index_select(0, index),
            generators=tuple(self.generators[r] for r in rows), all_greedy=bool((temperature == 0).all()),
        )

    def repeat_rows(self, times: int) -> "BatchParams":
        """Each row repeated ``times`` in place ([B] -> [B * times]), for per-position filtering."""
        return BatchParams(
            temperature=self.temperature.repeat_interleave(times), top_k=self.top_k.repeat_interleave(times),
            top_p=self.top_p.repeat_interleave(times),
            generators=tuple(g for g in self.generators for _ in range(times)), all_greedy=self.all_greedy,
        )
