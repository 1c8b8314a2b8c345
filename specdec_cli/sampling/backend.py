"""Rejection sampling on a backend: the torch implementation everywhere, flashinfer's fused CUDA kernel where
the validated config chose it (``config/validate.py`` decides the backend; nothing here probes or picks one).

Both backends share one contract (same shapes, same -1 padding, same acceptance rule ``u * draft < target``).
flashinfer is imported inside the function only, never when this module is imported.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from specdec_cli.sampling.acceptance import rejection_sample


def rejection_sample_with(
    backend: str,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    *,
    generators: Optional[Sequence[Optional[torch.Generator]]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rejection_sample`` on the chosen backend (same arguments and outputs).

    flashinfer's ``chain_speculative_sampling`` draws every row from one Philox stream, so batches with a
    seeded row (a non-None entry in ``generators``) and K == 0 run on the torch implementation, which keeps
    seeded rows batch-invariant.
    """
    seeded = generators is not None and any(g is not None for g in generators)
    if backend == "torch" or seeded or draft_tokens.shape[1] == 0:
        return rejection_sample(target_probs, draft_probs, draft_tokens, generator, generators=generators)
    from flashinfer.sampling import chain_speculative_sampling

    # flashinfer's kernel names q = target and p = draft internally; its Python keywords match ours.
    tokens, _independent_accepts, accepted_drafts = chain_speculative_sampling(
        draft_probs=draft_probs.float().contiguous(),
        draft_token_ids=draft_tokens.int().contiguous(),
        target_probs=target_probs.float().contiguous(),
        deterministic=True,
        generator=generator,
    )
    return tokens.long(), accepted_drafts.long() + 1
