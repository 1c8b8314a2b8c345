"""Backend layer: the torch implementation runs everywhere; flashinfer's fused CUDA kernels where available.

Both backends share one contract (same shapes, same -1 padding, same acceptance rule ``u * draft < target``).
flashinfer is imported inside functions only, never when this module is imported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from specdec_cli.sampling.acceptance import rejection_sample
from specdec_cli.sampling.probs import SamplingError, effective_top_k, probs_from_logits

BACKENDS = ("auto", "torch", "flashinfer")


@dataclass(frozen=True)
class BackendChoice:
    """The backend that will run ("torch" or "flashinfer") and why it was chosen."""

    name: str
    reason: str


def flashinfer_unavailable_reason(device: torch.device | str) -> Optional[str]:
    """None when flashinfer can run on ``device``, else a one-line reason (imports flashinfer on CUDA only)."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"flashinfer kernels need a CUDA device, the device is {device.type}"
    if not torch.cuda.is_available():
        return "torch reports no usable CUDA device"
    try:
        import flashinfer.sampling  # noqa: F401
    except Exception as exc:  # ImportError, or a broken CUDA / JIT installation
        return f"flashinfer is not importable ({type(exc).__name__}: {exc})"
    return None


def resolve_backend(requested: str, device: torch.device | str) -> BackendChoice:
    """requested "auto" | "torch" | "flashinfer" -> BackendChoice.

    "auto" picks flashinfer when it can run on the device and torch otherwise, with the reason;
    an explicit "flashinfer" that cannot run raises SamplingError naming the reason.
    """
    if requested not in BACKENDS:
        raise SamplingError(f"unknown sampling backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    if requested == "torch":
        return BackendChoice("torch", "requested")
    reason = flashinfer_unavailable_reason(device)
    if reason is None:
        why = "requested" if requested == "flashinfer" else "auto: available on this device"
        return BackendChoice("flashinfer", why)
    if requested == "flashinfer":
        raise SamplingError(f"sampling backend 'flashinfer' is unavailable: {reason}")
    return BackendChoice("torch", f"auto: {reason}")


def rejection_sample_with(
    backend: str,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    *,
    generators: Optional[list[Optional[torch.Generator]]] = None,
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


def probs_from_logits_with(
    backend: str,
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: Optional[torch.Tensor] = None,
    top_p: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``probs_from_logits`` on the chosen backend; flashinfer renormalises with its top-k / top-p kernels.

    The law is the same (top-k -> temperature softmax -> top-p); flashinfer may keep only some of the tokens
    tied at a filter boundary, where the torch implementation keeps them all.
    """
    if backend == "torch" or (top_k is None and top_p is None):
        return probs_from_logits(logits, temperature, top_k, top_p)
    from flashinfer.sampling import top_k_renorm_probs, top_p_renorm_probs

    probs = probs_from_logits(logits, temperature)  # validation, temperature softmax, greedy one-hot rows
    num_rows, vocab = probs.shape
    if top_k is not None:
        probs = top_k_renorm_probs(probs, effective_top_k(top_k, num_rows, vocab, probs.device).int())
    if top_p is not None:
        tiny = torch.finfo(torch.float32).tiny
        probs = top_p_renorm_probs(probs, top_p.to(probs.device, torch.float32).clamp(min=tiny, max=1.0))
    return probs
