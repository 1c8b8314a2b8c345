"""Speculation statistics, defined once.

- ``acceptance_length``: mean tokens emitted per verify step per request, *including* the
  bonus/recovered token (1.0 = speculation bought nothing; at most K+1).
- ``acceptance_rate``: accepted drafts / proposed drafts.
- ``per_position_acceptance[i]``: P(draft i+1 accepted | it was proposed).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    verify_steps: int = 0  # (request, step) pairs in the generation phase
    emitted_tokens: int = 0  # tokens emitted by those verify steps (before stop truncation)
    proposed_drafts: int = 0
    accepted_drafts: int = 0
    proposed_at: list[int] = field(default_factory=list)  # per draft position
    accepted_at: list[int] = field(default_factory=list)
    target_forwards: int = 0
    draft_forwards: int = 0
    guard_fallbacks: int = 0  # steps where the proposal guard forced strict acceptance
    generated_tokens: int = 0  # tokens in the final outputs
    wall_s: float = 0.0

    def observe(self, num_drafts: int, num_emitted: int) -> None:
        """One request's verify step: ``num_drafts`` proposed, ``num_emitted`` tokens out."""
        accepted = num_emitted - 1
        self.verify_steps += 1
        self.emitted_tokens += num_emitted
        self.proposed_drafts += num_drafts
        self.accepted_drafts += accepted
        while len(self.proposed_at) < num_drafts:
            self.proposed_at.append(0)
            self.accepted_at.append(0)
        for position in range(num_drafts):
            self.proposed_at[position] += 1
            self.accepted_at[position] += position < accepted

    def summary(self) -> dict:
        return {
            "acceptance_length": self.emitted_tokens / self.verify_steps if self.verify_steps else 0.0,
            "acceptance_rate": self.accepted_drafts / self.proposed_drafts if self.proposed_drafts else 0.0,
            "per_position_acceptance": [a / p for a, p in zip(self.accepted_at, self.proposed_at)],
            "proposed_drafts": self.proposed_drafts,
            "accepted_drafts": self.accepted_drafts,
            "verify_steps": self.verify_steps,
            "generated_tokens": self.generated_tokens,
            "target_forwards": self.target_forwards,
            "guard_fallbacks": self.guard_fallbacks,
            "wall_s": self.wall_s,
            "tokens_per_s": self.generated_tokens / self.wall_s if self.wall_s else 0.0,
        }
