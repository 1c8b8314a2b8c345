"""How tensor parallelism splits a model: contiguous, as-even-as-possible pieces per rank.

Every split dimension (KV heads, the MLP's intermediate features, the vocabulary) is cut into
``tp`` contiguous pieces whose sizes differ by at most one, so a model whose head count is not a
multiple of ``tp`` still shards (the embedded SmolLM2-135M: 3 KV heads over 2 ranks -> 2 + 1).
Query heads follow their KV head (GQA groups are never split), so a rank owning KV heads
``[a, b)`` owns query heads ``[a*g, b*g)`` with ``g = num_heads // num_kv_heads``.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec_cli.models import ModelArch


def split_sizes(total: int, parts: int) -> tuple[int, ...]:
    """``total`` cut into ``parts`` sizes differing by at most one, larger ones first."""
    base, extra = divmod(total, parts)
    return tuple(base + (index < extra) for index in range(parts))


@dataclass(frozen=True)
class Shard:
    """Rank ``rank``'s contiguous piece ``[start, end)`` of a dimension cut into ``sizes``."""

    sizes: tuple[int, ...]
    rank: int

    @classmethod
    def even(cls, total: int, parts: int, rank: int) -> Shard:
        """Rank ``rank``'s piece of ``total`` cut by ``split_sizes``."""
        return cls(split_sizes(total, parts), rank)

    @property
    def start(self) -> int:
        return sum(self.sizes[: self.rank])

    @property
    def size(self) -> int:
        return self.sizes[self.rank]

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def scaled(self, factor: int) -> Shard:
        """The same split in units ``factor`` times smaller (heads -> rows of ``head_dim``)."""
        return Shard(tuple(size * factor for size in self.sizes), self.rank)


@dataclass(frozen=True)
class HeadShards:
    """One rank's attention heads: its KV heads and the query heads of their GQA groups."""

    kv: Shard
    q: Shard


def head_shards(arch: ModelArch, tp: int, rank: int) -> HeadShards:
    """Rank ``rank``'s share of ``arch``'s attention heads under ``tp``-way tensor parallelism."""
    kv = Shard.even(arch.num_kv_heads, tp, rank)
    return HeadShards(kv=kv, q=kv.scaled(arch.num_groups))


def tp_problems(arch: ModelArch, tp: int) -> list[str]:
    """Why ``arch`` cannot be sharded ``tp`` ways (empty when it can)."""
    problems = []
    if tp > arch.num_kv_heads:
        problems.append(
            f"tensor parallelism over {tp} ranks needs at least {tp} key/value heads "
            f"(KV heads are not replicated); the model has {arch.num_kv_heads}"
        )
    if tp > arch.intermediate_size or tp > arch.vocab_size:
        problems.append(f"the model is too small to split {tp} ways")
    return problems
