"""Logits -> filtered probabilities: the single function that produces both target_probs and draft_probs."""
from __future__ import annotations

import math
from typing import Optional

import torch


class SamplingError(ValueError):
    """Invalid input to a sampling function (non-finite logits, bad parameters, inconsistent shapes)."""


def probs_from_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: Optional[torch.Tensor] = None,
    top_p: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """logits [N, V] with per-row temperature [N], top_k [N], top_p [N] -> probs [N, V] float32.

    Order: top-k mask on the logits -> softmax(logits / T) -> top-p renormalisation.
    - ``T == 0``: an exact one-hot at the argmax (lowest index on ties, like ``torch.argmax``).
    - top-k (off when ``top_k <= 0`` or ``>= V``) keeps every token whose logit is >= the k-th largest,
      so tokens tied at the boundary are all kept.
    - top-p (off when ``top_p >= 1``) keeps every token whose probability is >= that of the token at which
      the descending cumulative mass first reaches ``top_p``: the top token is always kept, boundary ties
      are all kept, and ``top_p <= 0`` keeps only the top token(s).

    Raises SamplingError for a row without a finite maximum (all -inf, or any NaN / +inf) and for a
    negative or non-finite temperature. Synchronises with the host once (validation and the number of
    candidates the filters need). Top-p on a row without top-k sorts the whole vocabulary, which is slow
    on CPU; pair it with top-k there.
    """
    if logits.dim() != 2 or logits.shape[-1] == 0:
        raise SamplingError(f"logits must be [N, V] with V > 0, got {tuple(logits.shape)}")
    logits = logits.float()
    num_rows, vocab = logits.shape
    for name, param in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if param is not None and param.shape != (num_rows,):
            raise SamplingError(f"{name} must have shape [{num_rows}], got {tuple(param.shape)}")
    if num_rows == 0:
        return logits.clone()
    device = logits.device
    temperature = temperature.to(device=device, dtype=torch.float32)
    row_max = logits.amax(dim=-1, keepdim=True)
    # every row's settings and whether its max is finite, read on the host at once (the one sync)
    host_t, host_k, host_p, finite_max = torch.stack([
        temperature,
        torch.zeros_like(temperature) if top_k is None else top_k.to(device=device, dtype=torch.float32),
        torch.ones_like(temperature) if top_p is None else top_p.to(device=device, dtype=torch.float32),
        torch.isfinite(row_max[:, 0]).float(),
    ]).tolist()
    if not all(finite_max):
        first = finite_max.index(0.0)
        raise SamplingError(
            f"{finite_max.count(0.0)} of {num_rows} logit rows have no finite maximum (all -inf, NaN or +inf); "
            f"first is row {first}"
        )
    n_bad_temperature = sum(not math.isfinite(t) or t < 0 for t in host_t)
    if n_bad_temperature:
        raise SamplingError(f"{n_bad_temperature} temperatures are negative or not finite")
    greedy_rows = [t == 0 for t in host_t]
    any_greedy = any(greedy_rows)
    top_k_rows = [not g and 0 < k < vocab for g, k in zip(greedy_rows, host_k)]
    top_p_rows = [not g and p < 1 for g, p in zip(greedy_rows, host_p)]
    any_top_p = any(top_p_rows)
    greedy = torch.tensor(greedy_rows, device=device) if any_greedy else None

    # Subtracting the row max before dividing keeps tiny temperatures finite.
    scaled = torch.sub(logits, row_max).div_(temperature[:, None] if greedy is None
                                             else torch.where(greedy, 1.0, temperature)[:, None])
    if any(top_k_rows) or any_top_p:  # the filters need the top candidates of their rows
        k_eff = [int(k) if on else vocab for k, on in zip(host_k, top_k_rows)]
        num_candidates = max(k for k, on, p_on in zip(k_eff, top_k_rows, top_p_rows) if on or p_on)
        candidate_logits, candidate_ids = logits.topk(num_candidates, dim=-1)
        kth = candidate_logits.gather(-1, torch.tensor(k_eff, device=device).clamp(max=num_candidates)[:, None] - 1)
        kth = torch.where(torch.tensor(top_k_rows, device=device)[:, None], kth, float("-inf"))
        scaled.masked_fill_(logits < kth, float("-inf"))
    probs = scaled.softmax(dim=-1)
    if any_top_p:
        candidate_probs = probs.gather(-1, candidate_ids)
        mass_before = candidate_probs.cumsum(dim=-1) - candidate_probs
        top_p = torch.tensor(host_p, device=device)
        num_kept = (mass_before < top_p[:, None]).sum(dim=-1).clamp(min=1)
        threshold = candidate_probs.gather(-1, (num_kept - 1)[:, None])
        probs.masked_fill_(probs < torch.where(torch.tensor(top_p_rows, device=device)[:, None], threshold, 0.0), 0.0)
        probs.div_(probs.sum(dim=-1, keepdim=True))
    if any_greedy:  # greedy rows become an exact one-hot at the argmax (first index of the max)
        argmax = logits.argmax(dim=-1, keepdim=True)
        probs.masked_fill_(greedy[:, None], 0.0)
        probs.scatter_(-1, argmax, torch.where(greedy[:, None], 1.0, probs.gather(-1, argmax)))
    return probs

