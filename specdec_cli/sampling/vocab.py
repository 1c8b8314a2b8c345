"""Reduced draft vocabularies (EAGLE-3 style): map draft ids and draft_probs into the target vocabulary.

A drafter with Vd < V tokens ships ``d2t [Vd]`` offsets: ``target_id = draft_id + d2t[draft_id]``.
Apply the map exactly once, to the token ids and to draft_probs alike.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from specdec_cli.sampling.probs import SamplingError


def draft_to_target_ids(draft_ids: torch.Tensor, d2t: Optional[torch.Tensor]) -> torch.Tensor:
    """Draft-vocabulary ids (any shape, int64) -> target ids of the same shape; identity when d2t is None."""
    if d2t is None:
        return draft_ids
    return draft_ids + d2t.to(draft_ids.device)[draft_ids]


def expand_draft_probs(draft_probs: torch.Tensor, d2t: Optional[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """draft_probs [B, K, Vd] -> [B, K, V] in target ids; target ids outside the map's image get 0.

    d2t None: identity when Vd == V (the input is returned as is), zero padding on the right when Vd < V.
    With d2t, the map must send the Vd ids to distinct ids in [0, V) (checked: one host sync).
    """
    draft_vocab = draft_probs.shape[-1]
    if d2t is None:
        if draft_vocab > vocab_size:
            raise SamplingError(
                f"draft vocabulary {draft_vocab} exceeds target vocabulary {vocab_size} and no d2t is given"
            )
        return draft_probs if draft_vocab == vocab_size else F.pad(draft_probs, (0, vocab_size - draft_vocab))
    if d2t.shape != (draft_vocab,):
        raise SamplingError(f"d2t must have shape [{draft_vocab}], got {tuple(d2t.shape)}")
    target_ids = draft_to_target_ids(torch.arange(draft_vocab, device=draft_probs.device), d2t.long())
    out_of_range = ((target_ids < 0) | (target_ids >= vocab_size)).any()
    if bool(out_of_range) or torch.unique(target_ids).numel() != draft_vocab:
        raise SamplingError(f"d2t must map the {draft_vocab} draft ids to distinct target ids in [0, {vocab_size})")
    expanded = draft_probs.new_zeros(*draft_probs.shape[:-1], vocab_size)
    return expanded.index_copy_(-1, target_ids, draft_probs)
