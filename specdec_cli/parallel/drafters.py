"""The target and the drafter of one tensor-parallel rank.

``shard_target_and_build_drafter`` shards ``deps.target`` in place and builds the method's drafter
with its registered factory, in the order the drafter needs:

- every drafter except a self-speculative draft_target is built from the *unsharded* target:
  retrieval drafters (ngram, suffix) and method=none do not read it; EAGLE-3, MTP and DFlash keep
  the target's embedding / LM head weights they copy at build time, i.e. whole replicated heads
  (an EAGLE-3 reduced-vocabulary head included) whose logits are never gathered; PARD and a
  separate draft_target model have their own weights. At run time they use the sharded target's
  forward (hidden states are whole after each row-parallel sum), in lockstep on every rank;
- a self-speculative draft_target *is* the target's first layers, so it is built from the sharded
  target and gets its own view of the vocab-sharded LM head, whose gather policy is chosen per
  ``propose`` (greedy: (max, argmax) pairs; sampled: all-gather);
- a separate draft_target model is sharded the same way when ``should_shard_draft`` says so
  (>= ``SHARD_DRAFT_MIN_PARAMS`` parameters), else replicated: whole logits, never gathered.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from specdec_cli.config.schema import MethodConfig
from specdec_cli.drafters import build_drafter, enhance
from specdec_cli.drafters.base import Drafter, DrafterDeps, DraftRequest, Proposal
from specdec_cli.drafters.draft_target import ModelDrafter
from specdec_cli.models import Transformer
from specdec_cli.parallel.comm import Comm
from specdec_cli.parallel.gather import GatherPolicy, draft_gather_policy
from specdec_cli.parallel.layers import ShardedLMHead
from specdec_cli.parallel.shard import shard_transformer, should_shard_draft
from specdec_cli.sampling.params import BatchParams


class ShardedHeadDrafter(ModelDrafter):
    """``ModelDrafter`` over a model whose LM head is vocab-sharded: every ``propose`` sets the
    head's gather policy from the batch (replicated facts, so every rank picks the same one)."""

    def __init__(self, model: Transformer, *, num_slots: int, max_seq_len: int, policy: str) -> None:
        if not isinstance(model.lm_head, ShardedLMHead):
            raise TypeError("ShardedHeadDrafter needs a model with a ShardedLMHead")
        super().__init__(model, num_slots=num_slots, max_seq_len=max_seq_len, policy=policy)
        self.head: ShardedLMHead = model.lm_head

    def propose(self, requests: list[DraftRequest], k: int, params: BatchParams) -> Proposal:
        greedy = self.policy == "argmax" or params.all_greedy
        self.head.policy = draft_gather_policy(tp_size=self.head.comm.size, replicated=False, greedy=greedy)
        return super().propose(requests, k, params)


def shard_target_and_build_drafter(cfg: MethodConfig, deps: DrafterDeps, comm: Comm) -> Optional[Drafter]:
    """Shard ``deps.target`` for this rank (in place) and return the method's drafter (see the module doc)."""
    self_speculative = getattr(cfg, "self_speculative_layers", None) is not None
    enhanced, cfg = cfg, dataclasses.replace(cfg, suffix_enhancer=False)  # shard the bare drafter, wrap it last
    drafter = None if self_speculative else build_drafter(cfg, deps)
    shard_transformer(deps.target, comm, policy=GatherPolicy.ALL_LOGITS, label="target")
    if self_speculative:
        drafter = build_drafter(cfg, deps)
    if type(drafter) is not ModelDrafter:  # every method but draft_target (PARD's subclass stays replicated)
        return enhance(drafter, enhanced, deps) if drafter is not None else None
    model = drafter.model
    if isinstance(model.lm_head, ShardedLMHead):  # self-speculative: the target's sharded layers
        model.lm_head = model.lm_head.view(policy=GatherPolicy.ALL_LOGITS, label="draft")
    elif should_shard_draft(model, comm.size):
        shard_transformer(model, comm, policy=GatherPolicy.ALL_LOGITS, label="draft")
    else:
        return enhance(drafter, enhanced, deps)  # replicated: whole logits on every rank (GatherPolicy.NONE)
    sharded = ShardedHeadDrafter(model, num_slots=deps.num_slots, max_seq_len=deps.max_seq_len, policy=drafter.policy)
    return enhance(sharded, enhanced, deps)
