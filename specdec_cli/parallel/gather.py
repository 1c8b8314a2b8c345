"""The gather policy for LM-head logits under tensor parallelism (reference: trtllm_spec.md §5).

A column-parallel LM head leaves every rank with the logits of its own vocabulary shard. Every
rank must nevertheless take the *same* draft and accept/reject decisions, so logits that stay
vocab-sharded are gathered before anyone picks a token:

- greedy drafts (``draft_policy=argmax`` or every request at temperature 0): each rank sends only
  its (max, argmax) pair; the global argmax is the pair with the largest value (ties go to the
  lowest rank = the lowest token id, exactly like ``argmax`` over the whole row);
- sampled drafts, and the target's rows (acceptance needs whole-vocabulary p): all-gather;
- a replicated head (a small replicated draft model, an EAGLE-3 style reduced vocabulary held
  whole on every rank): its logits are already whole and identical, and are never gathered.
  Whether logits are sharded is decided against the head's *own* vocabulary, never the
  target's: a reduced draft vocabulary is narrower than the target's but not sharded.

The decision depends only on replicated facts (tp size, how the head was built, the batch's
sampling parameters), so every rank takes it identically and issues the same collective.
"""
from __future__ import annotations

from enum import Enum

import torch

from specdec_cli.parallel.comm import Comm
from specdec_cli.parallel.partition import Shard


class GatherPolicy(str, Enum):
    NONE = "none"  # replicated head: logits are whole on every rank
    ARGMAX_PAIRS = "argmax_pairs"  # greedy drafts: each rank's (max, argmax) pair only
    ALL_LOGITS = "all_logits"  # sampled drafts and target rows: all-gather the logits


def draft_gather_policy(*, tp_size: int, replicated: bool, greedy: bool) -> GatherPolicy:
    """How draft logits reach every rank whole: nothing to do for one rank or a replicated head;
    (max, argmax) pairs when every draft is greedy; otherwise all-gather."""
    if tp_size == 1 or replicated:
        return GatherPolicy.NONE
    return GatherPolicy.ARGMAX_PAIRS if greedy else GatherPolicy.ALL_LOGITS


def gather_logits(local: torch.Tensor, shard: Shard, policy: GatherPolicy, comm: Comm, *, label: str) -> torch.Tensor:
    """This rank's logits [N, shard.size] -> whole-vocabulary logits [N, shard.total], the same on every rank.

    ``ARGMAX_PAIRS`` returns -inf everywhere except the global argmax (which keeps its value), so
    ``argmax`` and a temperature-0 one-hot over the result are exact. ``label`` names the head in
    the collective counts (e.g. ``draft.argmax_pairs``).
    """
    if policy is GatherPolicy.NONE:
        if local.shape[-1] != shard.total:
            raise ValueError(f"{label}: logits are {local.shape[-1]} wide but the head's vocabulary is "
                             f"{shard.total}: a vocab-sharded head needs a gather policy")
        return local
    if local.shape[-1] != shard.size:
        raise ValueError(f"{label}: expected this rank's {shard.size} vocabulary columns, got {local.shape[-1]}")
    if local.shape[0] == 0:  # every rank has the same (empty) batch: no collective
        return local.new_empty(0, shard.total)
    kind = f"{label}.{policy.value}"
    if policy is GatherPolicy.ALL_LOGITS:
        return comm.all_gather_last_dim(local, shard.sizes, kind=kind)
    return _gather_argmax(local, shard, comm, kind=kind)


def _gather_argmax(local: torch.Tensor, shard: Shard, comm: Comm, *, kind: str) -> torch.Tensor:
    index = local.argmax(dim=-1, keepdim=True)  # first maximum on ties
    # float64 holds float32 values and token ids (< 2**53) exactly
    pairs = torch.cat([local.gather(-1, index).double(), (index + shard.start).double()], dim=-1)  # [N, 2]
    gathered = comm.all_gather(pairs, kind=kind)  # [tp, N, 2]
    winner = gathered[..., 0].argmax(dim=0)  # [N]: the lowest rank among equal maxima
    best = gathered[winner, torch.arange(local.shape[0], device=local.device)]  # [N, 2]
    out = torch.full((local.shape[0], shard.total), float("-inf"), dtype=local.dtype, device=local.device)
    return out.scatter_(-1, best[:, 1:].long(), best[:, :1].to(local.dtype))
