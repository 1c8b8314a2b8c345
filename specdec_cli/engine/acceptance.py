"""Acceptance dispatch: which rule turns (target logits, drafts) into emitted tokens.

- all rows greedy            -> argmax fast path + strict acceptance (never rejection)
- rejection enabled + q ok   -> rejection sampling against the stored q (lossless)
- otherwise                  -> sample the target at every position, strict acceptance
                                (lossless for any drafter; lower acceptance than rejection)
"""
from __future__ import annotations

from typing import Optional

import torch

from specdec_cli.sampling import (
    probs_from_logits,
    rejection_sample_with,
    sample_from_probs,
    strict_accept,
)


def target_probs_for(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                     top_p: torch.Tensor) -> torch.Tensor:
    """logits [G, n, V] with per-request params [G] -> filtered probs [G, n, V]."""
    num_rows, positions, vocab = logits.shape
    flat = probs_from_logits(
        logits.reshape(num_rows * positions, vocab).float(),
        temperature.repeat_interleave(positions),
        top_k.repeat_interleave(positions),
        top_p.repeat_interleave(positions),
    )
    return flat.view(num_rows, positions, vocab)


def accept_group(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generators: list[Optional[torch.Generator]],
    draft_probs: Optional[torch.Tensor],
    use_rejection: bool,
    backend: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Accept drafts for G requests with the same runtime draft length k.

    logits [G, k+1, V]; draft_tokens [G, k] target ids; draft_probs [G, k, V] in the target
    vocabulary (already expanded through d2t) or None (one-hot q). Returns (tokens [G, k+1] padded with -1, num_emitted [G], rule).
    """
    num_rows, positions, vocab = logits.shape
    if bool((temperature == 0).all()):
        return (*strict_accept(draft_tokens, logits.argmax(dim=-1)), "greedy")
    target_probs = target_probs_for(logits, temperature, top_k, top_p)
    if use_rejection:
        full_q = draft_probs
        if full_q is None:
            full_q = torch.zeros(num_rows, positions - 1, vocab, dtype=torch.float32)
            full_q.scatter_(-1, draft_tokens.unsqueeze(-1), 1.0)
        tokens, emitted = rejection_sample_with(backend, target_probs, full_q, draft_tokens, generators=generators)
        return tokens, emitted, "rejection"
    row_generators = [g for g in generators for _ in range(positions)]
    target_tokens = sample_from_probs(target_probs.view(-1, vocab), row_generators).view(num_rows, positions)
    return (*strict_accept(draft_tokens, target_tokens), "strict")


def sample_first_tokens(logits: torch.Tensor, *, temperature: torch.Tensor, top_k: torch.Tensor,
                        top_p: torch.Tensor, generators: list[Optional[torch.Generator]]) -> torch.Tensor:
    """The token after a finished prefill: logits [R, V] -> tokens [R]."""
    if bool((temperature == 0).all()):
        return logits.argmax(dim=-1)
    return sample_from_probs(target_probs_for(logits[:, None], temperature, top_k, top_p)[:, 0], generators)
