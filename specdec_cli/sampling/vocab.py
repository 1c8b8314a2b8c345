"""Reduced draft vocabularies (EAGLE-3 style): map draft ids and draft_probs into the target vocabulary.

A drafter with Vd < V tokens ships ``d2t [Vd]`` offsets: ``target_id = draft_id + d2t[draft_id]``.
Apply the map exactly once, to the token ids and to draft_probs alike.
"""
from __future__ import annotations

import weakref
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
    target_ids = _checked_target_ids(d2t, vocab_size).to(draft_probs.device)
    expanded = draft_probs.new_zeros(*draft_probs.shape[:-1], vocab_size)
    return expanded.index_copy_(-1, target_ids, draft_probs)


def one_hot(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """tokens [...] int64 -> [..., vocab_size] float32 rows, 1 at each token (a deterministic draft's q)."""
    return torch.zeros(*tokens.shape, vocab_size, device=tokens.device).scatter_(-1, tokens[..., None], 1.0)


def draft_ids_of(d2t: Optional[torch.Tensor], draft_vocab_size: int, vocab_size: int) -> torch.Tensor:
    """target id -> draft id [V] int64 (host), -1 where the draft vocabulary has no such token."""
    lookup = torch.full((vocab_size,), -1, dtype=torch.int64, device="cpu")
    draft = torch.arange(min(draft_vocab_size, vocab_size) if d2t is None else draft_vocab_size, device="cpu")
    lookup[draft if d2t is None else draft + d2t.cpu()] = draft
    return lookup


_CHECKED: dict[int, tuple[weakref.ref, int, int, torch.Tensor]] = {}  # id(d2t) -> (d2t, version, V, target ids)


def _checked_target_ids(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """d2t's target ids [Vd], checked once per map (and again if it changes in place): the check is a host sync
    and a sort, too dear for every drafting step."""
    key = id(d2t)
    known = _CHECKED.get(key)
    if known is not None and known[0]() is d2t and known[1:3] == (d2t._version, vocab_size):
        return known[3]
    target_ids = draft_to_target_ids(torch.arange(d2t.numel(), device=d2t.device), d2t.long())
    out_of_range = ((target_ids < 0) | (target_ids >= vocab_size)).any()
    if bool(out_of_range) or torch.unique(target_ids).numel() != d2t.numel():
        raise SamplingError(f"d2t must map the {d2t.numel()} draft ids to distinct target ids in [0, {vocab_size})")
    _CHECKED[key] = (weakref.ref(d2t, lambda _: _CHECKED.pop(key, None)), d2t._version, vocab_size, target_ids)
    return target_ids
