"""Acceptance rules: (drafts, target) -> (tokens [B, K+1] padded with -1, num_emitted [B]).

Every rule emits the accepted draft prefix followed by exactly one more token, so num_emitted is in 1..K+1.
All rules are vectorised over batch and positions and never synchronise with the host.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from specdec_cli.sampling.draws import draw_uniforms, residual_masses, sample_target_or_residual
from specdec_cli.sampling.probs import SamplingError

PLACEHOLDER_TOKEN_ID = -1


def strict_accept(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_tokens [B, K], target_tokens [B, K+1] -> (tokens [B, K+1], num_emitted [B]).

    Accept drafts while they equal the target token at their position; then emit the target token at the
    first mismatch (or the bonus target token K when all match). Lossless when target_tokens are target samples.
    """
    _check_tokens(draft_tokens, target_tokens)
    num_accepted = _accepted_prefix(draft_tokens == target_tokens[:, :-1])
    return _emit(draft_tokens, num_accepted, target_tokens.gather(1, num_accepted[:, None])[:, 0])


def greedy_accept(draft_tokens: torch.Tensor, target_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """All-greedy fast path: target logits or probs [B, K+1, V] -> strict acceptance against their argmax."""
    return strict_accept(draft_tokens, target_scores.argmax(dim=-1))


def relaxed_accept(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    target_tokens: torch.Tensor,
    relaxed_topk: int,
    relaxed_delta: float,
    relaxed_mask: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MTP "thinking-phase" relaxed acceptance. LOSSY: the output is not distributed as the target.

    Draft i [B, K] is accepted if it equals target_tokens[:, i] [B, K+1], or if it is among the target's
    top-``relaxed_topk`` at position i (fewer than relaxed_topk tokens are strictly more probable, so
    boundary ties count as inside) and ``target_probs[:, i, draft] >= top1_prob - relaxed_delta``; the
    second way only where ``relaxed_mask`` [B, K] bool is set (None: everywhere; elsewhere strict).
    Stops at the first failure and emits target_tokens there (or the bonus target token K).
    """
    if relaxed_topk < 1 or relaxed_delta < 0:
        raise SamplingError(f"need relaxed_topk >= 1 and relaxed_delta >= 0, got {relaxed_topk}, {relaxed_delta}")
    _check_tokens(draft_tokens, target_tokens)
    scored = target_probs[:, :-1]
    draft_prob = scored.gather(-1, draft_tokens[..., None])
    num_more_probable = (scored > draft_prob).sum(dim=-1)
    near_top = draft_prob[..., 0] >= scored.amax(dim=-1) - relaxed_delta
    near = (num_more_probable < relaxed_topk) & near_top
    accepted = (draft_tokens == target_tokens[:, :-1]) | (near if relaxed_mask is None else near & relaxed_mask)
    num_accepted = _accepted_prefix(accepted)
    return _emit(draft_tokens, num_accepted, target_tokens.gather(1, num_accepted[:, None])[:, 0])


def thinking_mask(thinking_now: torch.Tensor, draft_tokens: torch.Tensor, begin_id: int, end_id: int) -> torch.Tensor:
    """Where relaxed acceptance may apply (TensorRT-LLM's gating): [B, K] bool, True at position i when the
    context draft i+1 is judged in (committed tokens + d_1..d_i) is inside the thinking phase, i.e. its last
    ``begin_id``/``end_id`` marker is ``begin_id``. thinking_now [B] bool: the state after the committed tokens."""
    marker = (draft_tokens == begin_id).long() - (draft_tokens == end_id).long()  # +1 begin, -1 end, 0 other
    positions = torch.arange(1, draft_tokens.shape[1] + 1, device=draft_tokens.device)
    last = torch.where(marker != 0, positions, 0).cummax(dim=1).values  # 1-based index of the last marker so far
    before = torch.cat([torch.zeros_like(last[:, :1]), last[:, :-1]], dim=1)  # markers among d_1..d_i only
    last_marker = marker.gather(1, (before - 1).clamp(min=0))
    return torch.where(before > 0, last_marker > 0, thinking_now[:, None].to(draft_tokens.device))


def rejection_sample(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    *,
    generators: Optional[list[Optional[torch.Generator]]] = None,
    uniforms: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Leviathan/Chen speculative sampling: the emitted tokens are distributed exactly as the target.

    target_probs [B, K+1, V], draft_probs [B, K, V] (what each draft was drawn from), draft_tokens [B, K]
    int64 target ids -> (tokens [B, K+1] int64 padded with -1, num_emitted [B] int64 in 1..K+1).

    Draft i is accepted iff ``u_i * draft_probs[i, d_i] < target_probs[i, d_i]`` (strict, float64: a draft
    the target gives 0 is never accepted, even with u_i == 0). At the first rejection the recovered token is
    drawn from normalize(max(target - draft, 0)) at that position (from the target row if that residual is
    numerically empty); when all K are accepted the bonus token is drawn from target row K.

    Randomness: K+1 float64 uniforms per row (K tests, then the recovered/bonus draw), from ``generator``
    (one stream for the batch) or ``generators`` (one per row, None = default RNG; batch-invariant).
    ``uniforms`` injects them instead: [B, K+1], or [B, K] with the final draw still taken from the generators.
    """
    k = target_probs.shape[1] - 1
    uniforms = _uniforms(target_probs, draft_probs, draft_tokens, generator, generators, uniforms)
    draft_tokens = draft_tokens.long()
    target_at_draft, draft_at_draft = _at_drafts(target_probs, draft_probs, draft_tokens)
    num_accepted = _accepted_prefix(uniforms[:, :k] * draft_at_draft < target_at_draft)
    if k == 0:
        final = sample_target_or_residual(target_probs, num_accepted, uniforms[:, k])
    else:
        final = sample_target_or_residual(
            target_probs,
            num_accepted,
            uniforms[:, k],
            draft_probs=draft_probs,
            draft_row=num_accepted.clamp(max=k - 1),
            use_residual=num_accepted < k,
        )
    return _emit(draft_tokens, num_accepted, final)


def block_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    *,
    generators: Optional[list[Optional[torch.Generator]]] = None,
    uniforms: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", 2024): the chain is
    judged as a whole, so the emitted tokens are distributed exactly as the target's and, in expectation, at least
    as many drafts are kept as by ``rejection_sample`` (same arguments, outputs and K+1 uniforms per row).

    With ratio_i = target_probs[i-1, d_i] / draft_probs[i-1, d_i], the block weights are w_0 = 1 and
    w_i = min(w_{i-1} * ratio_i, 1). Prefix i (1 <= i < K) is kept with probability h_i = m_i / (m_i + 1 - w_i),
    m_i = sum_v max(w_i * target_probs[i, v] - draft_probs[i, v], 0); the whole chain with h_K = w_K. The longest
    prefix whose test ``u_i < h_i`` passes is emitted (0 when none), then one token from
    normalize(max(w_i * target_probs[i] - draft_probs[i], 0)) at i < K, or from target row K (float64 weights).
    """
    k = target_probs.shape[1] - 1
    if k <= 0:  # no draft: the bonus draw alone, as token by token
        return rejection_sample(target_probs, draft_probs, draft_tokens, generator, generators=generators,
                                uniforms=uniforms)
    uniforms = _uniforms(target_probs, draft_probs, draft_tokens, generator, generators, uniforms)
    draft_tokens = draft_tokens.long()
    target_at_draft, draft_at_draft = _at_drafts(target_probs, draft_probs, draft_tokens)
    ratio = torch.where(draft_at_draft > 0, target_at_draft / draft_at_draft.clamp_min(1e-300), 0.0)
    weights = [torch.ones_like(ratio[:, 0])]
    for i in range(k):
        weights.append(torch.minimum(weights[-1] * ratio[:, i], torch.ones_like(ratio[:, i])))
    weight = torch.stack(weights, dim=1)  # [B, K+1]
    rows = torch.arange(1, k, device=target_probs.device)
    mass = residual_masses(target_probs, draft_probs, rows, weight[:, 1:k])  # m_1 .. m_{K-1}
    denominator = mass + 1 - weight[:, 1:k]
    keep = torch.where(denominator > 0, mass / denominator.clamp_min(1e-300), 0.0)  # h_1 .. h_{K-1}
    keep = torch.cat([keep, weight[:, k:]], dim=1)  # [B, K]: h_1 .. h_K
    positions = torch.arange(1, k + 1, device=keep.device)
    num_accepted = torch.where(uniforms[:, :k] < keep, positions, 0).amax(dim=1)
    # then one token from normalize(max(w_i * target_probs[i] - draft_probs[i], 0)), or target row K
    final = sample_target_or_residual(target_probs, num_accepted, uniforms[:, k], draft_probs=draft_probs,
                                      draft_row=num_accepted.clamp(max=k - 1), use_residual=num_accepted < k,
                                      target_scale=weight.gather(1, num_accepted[:, None])[:, 0])
    return _emit(draft_tokens, num_accepted, final)


def _at_drafts(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(target_probs[i, d_i], draft_probs[i, d_i]) [B, K] float64 for drafts d [B, K] int64."""
    ids = draft_tokens[..., None]
    k = draft_tokens.shape[1]
    return target_probs[:, :k].gather(-1, ids)[..., 0].double(), draft_probs.gather(-1, ids)[..., 0].double()


def _uniforms(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: Optional[torch.Generator],
    generators: Optional[list[Optional[torch.Generator]]],
    uniforms: Optional[torch.Tensor],
) -> torch.Tensor:
    """Checks a chain verification's shapes and returns its K+1 float64 uniforms per row [B, K+1] (drawn, or
    ``uniforms`` [B, K+1] / [B, K] with the last drawn)."""
    batch, positions, vocab = target_probs.shape
    k = positions - 1
    if k < 0 or draft_probs.shape != (batch, k, vocab) or draft_tokens.shape != (batch, k):
        raise SamplingError(
            f"need target_probs [B, K+1, V], draft_probs [B, K, V], draft_tokens [B, K]; got "
            f"{tuple(target_probs.shape)}, {tuple(draft_probs.shape)}, {tuple(draft_tokens.shape)}"
        )
    if generator is not None and generators is not None:
        raise SamplingError("pass either one generator or per-row generators, not both")
    device = target_probs.device
    source = generators if generators is not None else generator
    if uniforms is None:
        uniforms = draw_uniforms((k + 1,), source, num_rows=batch, device=device)
    elif uniforms.shape == (batch, k):
        final = draw_uniforms((1,), source, num_rows=batch, device=device)
        uniforms = torch.cat([uniforms.to(device, torch.float64), final], dim=1)
    elif uniforms.shape != (batch, k + 1):
        raise SamplingError(f"uniforms must be [B, K] or [B, K+1], got {tuple(uniforms.shape)}")
    return uniforms.to(device, torch.float64)


def _check_tokens(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> None:
    batch, k = draft_tokens.shape
    if target_tokens.shape != (batch, k + 1):
        raise SamplingError(f"target_tokens must be [{batch}, {k + 1}], got {tuple(target_tokens.shape)}")


def _accepted_prefix(accepted: torch.Tensor) -> torch.Tensor:
    """accepted [B, K] bool -> length of the all-true prefix [B] int64."""
    return accepted.long().cumprod(dim=1).sum(dim=1)


def _emit(
    draft_tokens: torch.Tensor, num_accepted: torch.Tensor, final_tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted draft prefix, then final_tokens [B] at column num_accepted, then -1 padding."""
    columns = torch.arange(draft_tokens.shape[1] + 1, device=draft_tokens.device)
    padded = F.pad(draft_tokens.long(), (0, 1), value=PLACEHOLDER_TOKEN_ID)
    tokens = torch.where(columns < num_accepted[:, None], padded, PLACEHOLDER_TOKEN_ID)
    tokens.scatter_(1, num_accepted[:, None], final_tokens.long()[:, None])
    return tokens, num_accepted + 1
