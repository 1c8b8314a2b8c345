"""Logits -> filtered probabilities: the single function that produces both target_probs and draft_probs."""
from __future__ import annotations

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
    greedy = temperature == 0
    row_max = logits.amax(dim=-1, keepdim=True)

    k_eff = effective_top_k(top_k, num_rows, vocab, device)
    top_k_on = (k_eff < vocab) & ~greedy
    if top_p is None:
        top_p_on = torch.zeros_like(greedy)
    else:
        top_p = top_p.to(device=device, dtype=torch.float32)
        top_p_on = (top_p < 1) & ~greedy
    needed = torch.where(top_k_on | top_p_on, k_eff, 0)
    bad_rows = ~torch.isfinite(row_max[:, 0])
    bad_temperature = ~torch.isfinite(temperature) | (temperature < 0)
    n_bad_rows, n_bad_temperature, num_candidates, any_top_p, any_greedy = torch.stack(
        [bad_rows.sum(), bad_temperature.sum(), needed.max(), top_p_on.sum(), greedy.sum()]
    ).tolist()
    if n_bad_rows:
        first = int(bad_rows.nonzero()[0, 0])
        raise SamplingError(
            f"{n_bad_rows} of {num_rows} logit rows have no finite maximum (all -inf, NaN or +inf); "
            f"first is row {first}"
        )
    if n_bad_temperature:
        raise SamplingError(f"{n_bad_temperature} temperatures are negative or not finite")

    # Subtracting the row max before dividing keeps tiny temperatures finite.
    scaled = torch.sub(logits, row_max).div_(torch.where(greedy, 1.0, temperature)[:, None])
    if num_candidates:
        candidate_logits, candidate_ids = logits.topk(num_candidates, dim=-1)
        kth = candidate_logits.gather(-1, (k_eff.clamp(max=num_candidates) - 1)[:, None])
        kth = torch.where(top_k_on[:, None], kth, float("-inf"))
        scaled.masked_fill_(logits < kth, float("-inf"))
    probs = scaled.softmax(dim=-1)
    if any_top_p:
        candidate_probs = probs.gather(-1, candidate_ids)
        mass_before = candidate_probs.cumsum(dim=-1) - candidate_probs
        num_kept = (mass_before < top_p[:, None]).sum(dim=-1).clamp(min=1)
        threshold = candidate_probs.gather(-1, (num_kept - 1)[:, None])
        probs.masked_fill_(probs < torch.where(top_p_on[:, None], threshold, 0.0), 0.0)
        probs.div_(probs.sum(dim=-1, keepdim=True))
    if any_greedy:  # greedy rows become an exact one-hot at the argmax (first index of the max)
        argmax = logits.argmax(dim=-1, keepdim=True)
        probs.masked_fill_(greedy[:, None], 0.0)
        probs.scatter_(-1, argmax, torch.where(greedy[:, None], 1.0, probs.gather(-1, argmax)))
    return probs


def effective_top_k(top_k: Optional[torch.Tensor], num_rows: int, vocab: int, device: torch.device) -> torch.Tensor:
    """Per-row k [N] int64, with V standing for 'off' (top_k None, <= 0 or >= V)."""
    if top_k is None:
        return torch.full((num_rows,), vocab, dtype=torch.int64, device=device)
    top_k = top_k.to(device=device, dtype=torch.int64)
    return torch.where((top_k <= 0) | (top_k >= vocab), vocab, top_k)
