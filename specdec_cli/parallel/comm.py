"""The tensor-parallel group's collectives, counted by kind.

Every collective the sharded model issues goes through ``Comm`` so that the counts can be
reported (``results.json`` -> ``parallel.collectives``) and tested (which gather policy ran).
All ranks issue the same collectives in the same order with the same shapes: the callers only
branch on data that is replicated on every rank (batch composition, sampling parameters).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Optional

import torch
import torch.distributed as dist


class Comm:
    """Collectives over one process group (None: the default group)."""

    def __init__(self, rank: int, size: int, group: Optional[dist.ProcessGroup] = None) -> None:
        self.rank, self.size, self.group = rank, size, group
        self.counts: Counter[str] = Counter()

    def all_reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        """Elementwise sum of ``x`` over the ranks, bitwise identical on every rank.

        Two ranks use the library all-reduce (``a + b == b + a`` exactly). More ranks gather the
        parts and add them in rank order: a ring all-reduce's summation order depends on how the
        tensor is chunked, i.e. on its size, which would make a token's result depend on how
        many tokens share the forward (greedy speculative output must equal greedy decoding).
        """
        self.counts["all_reduce"] += 1
        if x.numel() == 0:
            return x
        if self.size == 2:
            x = x.contiguous()
            dist.all_reduce(x, group=self.group)
            return x
        parts = self._all_gather(x)
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        return total

    def all_gather(self, x: torch.Tensor, *, kind: str) -> torch.Tensor:
        """Every rank's ``x`` (same shape everywhere), stacked along a new first dim: [size, ...]."""
        self.counts[kind] += 1
        return torch.stack(self._all_gather(x))

    def all_gather_last_dim(self, x: torch.Tensor, sizes: tuple[int, ...], *, kind: str) -> torch.Tensor:
        """Concatenate every rank's ``x`` [..., sizes[rank]] along the last dim -> [..., sum(sizes)].

        Uneven pieces are padded to the largest for the collective and trimmed afterwards.
        """
        self.counts[kind] += 1
        width = max(sizes)
        padded = x
        if x.shape[-1] < width:
            pad = x.new_zeros(*x.shape[:-1], width - x.shape[-1])
            padded = torch.cat([x, pad], dim=-1)
        parts = self._all_gather(padded.contiguous())
        return torch.cat([part[..., :size] for part, size in zip(parts, sizes, strict=True)], dim=-1)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order."""
        self.counts["all_gather_object"] += 1
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def _all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return parts
