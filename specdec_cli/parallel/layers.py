"""Tensor-parallel building blocks that replace a loaded ``Transformer``'s modules.

- ``column_slice``: a ``Linear`` keeping some of its output rows (q/k/v, gate/up, the LM head);
- ``RowParallelLinear``: a ``Linear`` keeping some of its input columns, partial outputs summed
  over the ranks (o_proj, down_proj); a bias is added once, after the sum;
- ``VocabParallelEmbedding``: this rank's vocabulary rows; other ids give zeros, summed over ranks;
- ``ShardedLMHead``: this rank's vocabulary rows of the LM head, gathered by a ``GatherPolicy``.

Weights are copied out of the full module (``clone``), so the full tensors are freed when the
original module is dropped. All new modules keep fast_linear's ``Linear`` for the matmul, so
row invariance (a token's output independent of the batch shape) carries over.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdec_cli.models.fast_linear import Linear
from specdec_cli.parallel.comm import Comm
from specdec_cli.parallel.gather import GatherPolicy, gather_logits
from specdec_cli.parallel.partition import Shard


def _frozen(tensor: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(tensor.detach().clone(), requires_grad=False)


def column_slice(linear: Linear, rows: Shard) -> Linear:
    """A new ``Linear`` with output rows ``rows.start .. rows.end`` of ``linear`` (and of its bias)."""
    weight = linear.weight
    out = Linear(linear.in_features, rows.size, linear.bias is not None, dtype=weight.dtype, device=weight.device)
    out.weight = _frozen(weight.narrow(0, rows.start, rows.size))
    if linear.bias is not None:
        out.bias = _frozen(linear.bias.narrow(0, rows.start, rows.size))
    out.row_invariant = linear.row_invariant
    return out


class RowParallelLinear(nn.Module):
    """``y = sum over ranks (x_rank @ W[:, cols_rank].T) + bias``: x is this rank's slice of the input."""

    def __init__(self, linear: Linear, cols: Shard, comm: Comm) -> None:
        super().__init__()
        weight = linear.weight
        self.linear = Linear(cols.size, linear.out_features, dtype=weight.dtype, device=weight.device)
        self.linear.weight = _frozen(weight.narrow(1, cols.start, cols.size))
        self.linear.row_invariant = linear.row_invariant
        self.bias = None if linear.bias is None else _frozen(linear.bias)
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.comm.all_reduce_sum(self.linear(x))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding rows ``shard.start .. shard.end``; ids outside them give zeros, then a sum over ranks.

    Exactly one rank contributes a non-zero row per id, so the sum is the embedding, bit for bit.
    """

    def __init__(self, embedding: nn.Embedding, shard: Shard, comm: Comm) -> None:
        super().__init__()
        self.weight = _frozen(embedding.weight.narrow(0, shard.start, shard.size))
        self.shard, self.comm = shard, comm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.shard.start
        owned = (local >= 0) & (local < self.shard.size)
        out = F.embedding(local.clamp(0, self.shard.size - 1), self.weight)
        return self.comm.all_reduce_sum(out.masked_fill_(~owned[..., None], 0.0))


class ShardedLMHead(nn.Module):
    """Column-parallel LM head over vocabulary rows ``shard.start .. shard.end``.

    ``forward`` returns float32 logits, gathered to the whole vocabulary by ``policy`` (see
    ``parallel.gather``); the owner of the head may change ``policy`` between forwards, the same
    way on every rank. ``label`` names the head in the collective counts.
    """

    def __init__(self, linear: Linear, shard: Shard, comm: Comm, *, policy: GatherPolicy, label: str) -> None:
        super().__init__()
        self.linear, self.shard, self.comm = linear, shard, comm
        self.policy, self.label = policy, label

    @property
    def weight(self) -> nn.Parameter:
        return self.linear.weight

    @property
    def row_invariant(self) -> bool:
        return self.linear.row_invariant

    def view(self, *, policy: GatherPolicy, label: str) -> ShardedLMHead:
        """Another head over the same weights (e.g. a self-speculative draft's) with its own policy."""
        return ShardedLMHead(self.linear, self.shard, self.comm, policy=policy, label=label)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = self.linear(x).float()
        return gather_logits(local, self.shard, self.policy, self.comm, label=self.label)
