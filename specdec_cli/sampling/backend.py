"""Rejection sampling on a backend: the torch implementation everywhere, flashinfer's fused CUDA kernel where
the validated config chose it (``config/validate.py`` decides the backend; nothing here probes or picks one).

Both backends share one contract (same shapes, same -1 padding, same acceptance rule ``u * draft < target``).
flashinfer is imported inside the function only, never when this module is imported.

Randomness on flashinfer: its kernel draws from Philox with a per-row ``seed`` and ``offset`` (int64 tensors of
length B). Row b's seed is drawn from row b's own generator (the default RNG of the device where it has none),
offset 0, so a seeded request's stream depends only on its generator, as on the torch backend (the two
backends' streams differ; both are exact). ``kernel_backend`` says which kernel a call actually runs.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from specdec_cli.sampling.acceptance import block_verify, rejection_sample
from specdec_cli.sampling.draws import Generators, draw_uniforms

_SEED_RANGE = float(2**53)  # a float64 uniform carries 53 bits


def kernel_backend(backend: str, num_drafts: int, verification: str = "token") -> str:
    """The kernel a rejection call runs: ``flashinfer`` where configured, except K == 0 (no draft to test:
    the bonus draw alone, which flashinfer's chain kernel does not take) and the block rule (its chain kernel tests
    token by token) -> ``torch``."""
    return "flashinfer" if backend == "flashinfer" and num_drafts > 0 and verification == "token" else "torch"


def philox_seeds(generators: Generators, num_rows: int, device: torch.device) -> torch.Tensor:
    """[num_rows] int64 seeds on ``device``: row b's from its own generator (batch-invariant for seeded rows)."""
    return (draw_uniforms((), generators, num_rows=num_rows, device=device) * _SEED_RANGE).long()


def rejection_sample_with(
    backend: str,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    *,
    generators: Optional[Sequence[Optional[torch.Generator]]] = None,
    verification: str = "token",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rejection_sample`` (``verification="token"``) or ``block_verify`` (``"block"``, torch only) on the chosen
    backend (same arguments and outputs); seeded and unseeded rows both run on flashinfer when it is the backend
    (see the module doc for their seeds)."""
    if kernel_backend(backend, draft_tokens.shape[1], verification) == "torch":
        rule = block_verify if verification == "block" else rejection_sample
        return rule(target_probs, draft_probs, draft_tokens, generator, generators=generators)
    from flashinfer.sampling import chain_speculative_sampling

    batch, device = draft_tokens.shape[0], target_probs.device
    seeds = philox_seeds(generators if generators is not None else generator, batch, device)
    # flashinfer's kernel names q = target and p = draft internally; its Python keywords match ours.
    tokens, _independent_accepts, accepted_drafts = chain_speculative_sampling(
        draft_probs=draft_probs.float().contiguous(),
        draft_token_ids=draft_tokens.int().contiguous(),
        target_probs=target_probs.float().contiguous(),
        deterministic=True,
        seed=seeds,
        offset=torch.zeros(batch, dtype=torch.int64, device=device),
    )
    return tokens.long(), accepted_drafts.long() + 1
