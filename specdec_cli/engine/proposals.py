"""The slot-indexed proposal buffer between drafting (step t) and acceptance (step t+1).

``draft_tokens[num_slots + 1, max_draft_len]`` (target ids) and ``draft_probs[num_slots + 1, max_draft_len, V]``
(the q each draft was drawn from, **in the target vocabulary**) are keyed by the request's KV slot, which stays
stable while the batch composition changes between steps. The last row is scratch. d2t is applied exactly once,
when a proposal is written (``Proposal.target_probs``); reads never map again. Rows of a slot that got no real
drafts hold a one-hot placeholder so that acceptance always reads a legal distribution. ``num_drafts[slot]`` is
the runtime draft length of that slot's last proposal.

Fail closed: ``check`` validates a slot's proposal before it is verified (a bad one is dropped), and ``read``
reports whether every draft has q(d) > 0 (a token cannot have been drawn from a distribution that gives it no
mass); either failure means strict acceptance.
"""
from __future__ import annotations

from typing import Optional

import torch

from specdec_cli.drafters.base import Proposal

PLACEHOLDER_DRAFT_ID = 0  # target-vocabulary id used by placeholder rows


class ProposalBuffer:
    def __init__(self, num_slots: int, max_draft_len: int, vocab_size: int, *, store_probs: bool,
                 device: torch.device | str = "cpu") -> None:
        self.num_slots = num_slots
        self.max_draft_len = max_draft_len
        self.vocab_size = vocab_size
        rows = num_slots + 1
        # on the model's device, next to the logits that read them
        self.draft_tokens = torch.zeros(rows, max(max_draft_len, 1), dtype=torch.int64, device=device)
        # [num_slots + 1, max_draft_len, V]; only when acceptance will read a real q
        self.draft_probs: Optional[torch.Tensor] = (
            torch.zeros(rows, max(max_draft_len, 1), vocab_size, dtype=torch.float32, device=device)
            if store_probs and max_draft_len > 0
            else None
        )
        self.num_drafts = [0] * rows
        self.holds_placeholder = [False] * rows  # rows of the slot already hold the placeholder (skip rewriting)

    def write_proposal(self, slots: list[int], proposal: Proposal, d2t: Optional[torch.Tensor]) -> None:
        """Store a drafter's proposal, row r for ``slots[r]``; its q is mapped to target ids here, once."""
        used = max(proposal.num_drafts, default=0)
        probs = proposal.target_probs(d2t, self.vocab_size, used) if self.draft_probs is not None else None
        for row, slot in enumerate(slots):
            self.write(slot, proposal.tokens[row], None if probs is None else probs[row], proposal.num_drafts[row])

    def write(self, slot: int, tokens: torch.Tensor, probs: Optional[torch.Tensor], num: int) -> None:
        """Store ``num`` drafts for ``slot``: tokens [>= num] target ids, probs [>= num, V] target vocabulary
        or None (q is one-hot at the drafted token)."""
        self.num_drafts[slot] = num
        if num == 0:
            self.write_placeholder(slot)
            return
        self.holds_placeholder[slot] = False
        self.draft_tokens[slot, :num] = tokens[:num]
        if self.draft_probs is not None:
            if probs is None:
                self.draft_probs[slot, :num].zero_()
                self.draft_probs[slot, :num].scatter_(-1, tokens[:num, None], 1.0)
            else:
                self.draft_probs[slot, :num] = probs[:num]

    def write_placeholder(self, slot: int) -> None:
        """A slot without real drafts: one-hot rows at the placeholder id, zero drafts."""
        self.num_drafts[slot] = 0
        if self.holds_placeholder[slot]:  # a request that does not draft: no [K, V] rewrite every step
            return
        self.holds_placeholder[slot] = True
        self.draft_tokens[slot].fill_(PLACEHOLDER_DRAFT_ID)
        if self.draft_probs is not None:
            self.draft_probs[slot].zero_()
            self.draft_probs[slot, :, PLACEHOLDER_DRAFT_ID] = 1.0

    def read(self, slots: list[int], k: int) -> tuple[torch.Tensor, Optional[torch.Tensor], bool]:
        """Drafts of ``slots`` at runtime length ``k``: (tokens [R, k], probs [R, k, V] or None,
        whether every draft has q(d) > 0 under its stored q (True when no q is stored)).
        Host syncs: the q(d) > 0 flag (one per group); ``check`` reads a slot's min/max id and the engine
        its drafts (to feed the verify) -- the step's remaining syncs besides the accepted counts."""
        index = torch.tensor(slots, dtype=torch.int64, device=self.draft_tokens.device)
        tokens = self.draft_tokens[:, :k].index_select(0, index)
        if self.draft_probs is None:
            return tokens, None, True
        probs = self.draft_probs[:, :k].index_select(0, index)  # copies [R, k, V], not [R, K, V]
        return tokens, probs, bool((probs.gather(-1, tokens[..., None]) > 0).all())

    def check(self, slot: int) -> Optional[str]:
        """Structural check of one slot's proposal before it is verified; the problem or None."""
        num = self.num_drafts[slot]
        if not 0 <= slot < self.num_slots:
            return f"slot {slot} out of range"
        if not 0 <= num <= self.max_draft_len:
            return f"slot {slot}: {num} drafts recorded, buffer holds at most {self.max_draft_len}"
        tokens = self.draft_tokens[slot, :num]
        if num and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            return f"slot {slot}: draft token id outside the target vocabulary"
        return None
