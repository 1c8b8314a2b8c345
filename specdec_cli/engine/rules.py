"""Acceptance dispatch: which rule turns (target logits, drafts) into emitted tokens.

- all rows greedy            -> argmax fast path + strict acceptance (never rejection)
- rejection enabled + q ok   -> rejection sampling against the stored q (lossless)
- relaxed (MTP only, LOSSY)  -> accept drafts near the target's top (sampling.relaxed_accept)
- otherwise                  -> sample the target at every position, strict acceptance
                                (lossless for any drafter; lower acceptance than rejection)
"""
from __future__ import annotations

from typing import Optional

import torch

from specdec_cli.sampling import (
    probs_from_logits,
    rejection_sample_with,
    relaxed_accept,
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
    relaxed: Optional[tuple[int, float]] = None,
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Accept drafts for G requests with the same runtime draft length k.

    logits [G, k+1, V]; draft_tokens [G, k] target ids; draft_probs [G, k, V] in the target
    vocabulary (already expanded through d2t) or None (one-hot q). ``relaxed`` = (top-k, delta)
    selects relaxed acceptance (lossy). Returns (tokens [G, k+1] padded with -1, num_emitted [G], rule).
    """
    num_rows, positions, vocab = logits.shape
    if relaxed is not None:
        target_tokens = _target_tokens(logits, temperature, top_k, top_p, generators)
        tokens, emitted = relaxed_accept(draft_tokens, logits.float().softmax(-1), target_tokens, *relaxed)
        return tokens, emitted, "relaxed"
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
    return (*strict_accept(draft_tokens, _target_tokens(logits, temperature, top_k, top_p, generators, target_probs)),
            "strict")


def _target_tokens(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                   generators: list[Optional[torch.Generator]],
                   target_probs: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The target's own token at every position: logits [G, n, V] -> [G, n] (argmax rows stay exact)."""
    num_rows, positions, vocab = logits.shape
    if target_probs is None:
        target_probs = target_probs_for(logits, temperature, top_k, top_p)
    row_generators = [g for g in generators for _ in range(positions)]
    return sample_from_probs(target_probs.view(-1, vocab), row_generators).view(num_rows, positions)


def sample_first_tokens(logits: torch.Tensor, *, temperature: torch.Tensor, top_k: torch.Tensor,
                        top_p: torch.Tensor, generators: list[Optional[torch.Generator]]) -> torch.Tensor:
    """The token after a finished prefill: logits [R, V] -> tokens [R]."""
    if bool((temperature == 0).all()):
        return logits.argmax(dim=-1)
    return sample_from_probs(target_probs_for(logits[:, None], temperature, top_k, top_p)[:, 0], generators)
