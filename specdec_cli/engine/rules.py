"""The one acceptance decision: which rule turns (target logits, drafts) into emitted tokens.

``acceptance_rule`` decides per group of requests (same runtime K), in this order:
- relaxed   (MTP, LOSSY; K > 0)                 -> drafts near the target's top (sampling.relaxed_accept),
                                                   only inside the thinking phase (between the begin/end
                                                   thinking token ids; strict elsewhere), or everywhere
                                                   when no ids are set (method.relaxed_everywhere=true)
- argmax    (every row greedy)                  -> strict acceptance against the target argmax; never rejection
- rejection (enabled, K > 0, the stored q is consistent) -> rejection sampling against the stored q (lossless;
                                                   token by token, or the block rule: rejection.verification)
- strict    (otherwise)                         -> sample the target at every position, strict acceptance
                                                   (lossless for any drafter; lower acceptance than rejection)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

import torch

from specdec_cli.sampling import (
    BatchParams,
    filtered_probs,
    greedy_accept,
    one_hot,
    rejection_sample_with,
    relaxed_accept,
    sample_tokens,
    strict_accept,
    thinking_mask,
)
from specdec_cli.sampling.backend import kernel_backend

RuleName = Literal["argmax", "strict", "rejection", "relaxed"]


@dataclass(frozen=True)
class AcceptanceOptions:
    """The effective acceptance settings of a run (from the validated config)."""

    rejection: bool = True  # rejection sampling where the drafter stored drafts (and maybe a q)
    backend: str = "torch"  # rejection kernel: torch | flashinfer
    verification: str = "token"  # token by token, or block: a chain's block / a tree's traversal verification
    relaxed: Optional[tuple[int, float]] = None  # (top-k, delta): MTP relaxed acceptance, lossy
    thinking: Optional[tuple[int, int]] = None  # (begin, end) thinking token ids gating relaxed (None: everywhere)
    # rejection groups per kernel that actually ran them, counted where the kernel is called (metrics.backend_usage)
    usage: dict[str, int] = field(default_factory=lambda: {"torch": 0, "flashinfer": 0}, compare=False)


@dataclass(frozen=True)
class Rule:
    """A decided rule with the settings it needs; ``accept`` applies it to one group."""

    name: RuleName
    options: AcceptanceOptions

    def accept(self, logits: torch.Tensor, draft_tokens: torch.Tensor, draft_probs: Optional[torch.Tensor],
               params: BatchParams, contexts: Optional[list[list[int]]] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [G, k+1, V]; draft_tokens [G, k] target ids; draft_probs [G, k, V] target vocabulary or None
        (one-hot at the drafts); contexts: each row's committed tokens (read by the gated relaxed rule only)
        -> (tokens [G, k+1] padded with -1, num_emitted [G] in 1..k+1)."""
        if self.name == "argmax":
            return greedy_accept(draft_tokens, logits)
        if self.name == "relaxed":
            target_tokens = sample_tokens(logits, params)
            return relaxed_accept(draft_tokens, logits.float().softmax(-1), target_tokens, *self.options.relaxed,
                                  relaxed_mask=self._thinking_mask(draft_tokens, contexts))
        target_probs = filtered_probs(logits, params)
        if self.name == "strict":
            return strict_accept(draft_tokens, sample_tokens(logits, params, target_probs))
        if draft_probs is None:
            draft_probs = one_hot(draft_tokens.to(logits.device), logits.shape[-1])
        backend, verification = self.options.backend, self.options.verification
        self.options.usage[kernel_backend(backend, draft_tokens.shape[1], verification)] += 1
        return rejection_sample_with(backend, target_probs, draft_probs, draft_tokens, generators=params.generators,
                                     verification=verification)


    def _thinking_mask(self, draft_tokens: torch.Tensor, contexts: Optional[list[list[int]]]) -> Optional[torch.Tensor]:
        """[G, k] where relaxed acceptance may apply (None: everywhere, no thinking ids configured)."""
        if self.options.thinking is None:
            return None
        if contexts is None:
            raise ValueError("the gated relaxed rule needs each row's committed tokens (contexts)")
        begin, end = self.options.thinking
        now = torch.tensor([in_thinking(tokens, begin, end) for tokens in contexts], dtype=torch.bool)
        return thinking_mask(now, draft_tokens, begin, end)


def in_thinking(token_ids: list[int], begin_id: int, end_id: int) -> bool:
    """Whether ``token_ids`` ends inside the thinking phase: its last begin/end marker is ``begin_id``."""
    for token in reversed(token_ids):
        if token == begin_id or token == end_id:
            return token == begin_id
    return False


def acceptance_rule(params: BatchParams, k: int, options: AcceptanceOptions, *, proposal_ok: bool = True) -> Rule:
    """The rule for a group of requests at runtime draft length ``k`` (see the module doc for the order).

    ``proposal_ok`` is the fail-closed check of the group's stored q (every draft has q(d) > 0): when it
    fails, rejection falls back to strict acceptance (still lossless).
    """
    if options.relaxed is not None and k > 0:
        return Rule("relaxed", options)
    if params.all_greedy:
        return Rule("argmax", options)
    if options.rejection and k > 0 and proposal_ok:
        return Rule("rejection", options)
    return Rule("strict", options)
