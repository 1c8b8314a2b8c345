"""Straightforward float64 per-row reference of rejection sampling, for tests and benchmarks.

It reads like the paper (one row, one position at a time) and consumes the uniforms exactly as
``rejection_sample`` does, so both give identical tokens for identical uniforms.
"""
from __future__ import annotations

import torch

from specdec_cli.sampling.acceptance import PLACEHOLDER_TOKEN_ID


def rejection_sample_reference(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """target_probs [B, K+1, V], draft_probs [B, K, V], draft_tokens [B, K], uniforms [B, K+1] in [0, 1)
    -> (tokens [B, K+1] int64 padded with -1, num_emitted [B] int64). Uniform i tests draft i; uniform K
    draws the recovered or bonus token."""
    batch, positions, _ = target_probs.shape
    k = positions - 1
    tokens = torch.full((batch, positions), PLACEHOLDER_TOKEN_ID, dtype=torch.int64)
    for b in range(batch):
        u_final = float(uniforms[b, k])
        for i in range(k):
            draft = int(draft_tokens[b, i])
            target_prob = float(target_probs[b, i, draft])
            draft_prob = float(draft_probs[b, i, draft])
            if float(uniforms[b, i]) * draft_prob < target_prob:
                tokens[b, i] = draft
                continue
            target_row = target_probs[b, i].double()
            residual = (target_row - draft_probs[b, i].double()).clamp(min=0)
            tokens[b, i] = _inverse_cdf(residual if residual.sum() > 0 else target_row, u_final)
            break
        else:
            tokens[b, k] = _inverse_cdf(target_probs[b, k].double(), u_final)
    return tokens, (tokens != PLACEHOLDER_TOKEN_ID).sum(dim=1)


def _inverse_cdf(weights: torch.Tensor, uniform: float) -> int:
    """First index whose cumulative weight exceeds uniform * total; the last positive index if none does."""
    cdf = weights.cumsum(dim=0)
    index = int((cdf <= uniform * float(cdf[-1])).sum())
    return index if index < weights.numel() else int(weights.nonzero().max())
