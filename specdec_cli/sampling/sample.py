"""The target's side of sampling, batched over rows and positions with one ``BatchParams``."""
from __future__ import annotations

from typing import Optional

import torch

from specdec_cli.sampling.draws import sample_from_probs
from specdec_cli.sampling.params import BatchParams
from specdec_cli.sampling.probs import probs_from_logits


def filtered_probs(logits: torch.Tensor, params: BatchParams) -> torch.Tensor:
    """logits [G, n, V] with G rows of ``params`` -> probs [G, n, V] float32 (row g's filters at every position)."""
    num_rows, positions, vocab = logits.shape
    per_position = params.repeat_rows(positions)
    flat = probs_from_logits(logits.reshape(num_rows * positions, vocab).float(), per_position.temperature,
                             per_position.top_k, per_position.top_p)
    return flat.view(num_rows, positions, vocab)


def sample_tokens(logits: torch.Tensor, params: BatchParams, probs: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The target's own token at every position: logits [G, n, V] -> tokens [G, n] int64.

    An all-greedy batch takes the argmax (no draws); otherwise each row draws one uniform per position
    from its generator, from ``probs`` when given (= ``filtered_probs(logits, params)``), so greedy rows
    of a mixed batch still return their argmax exactly.
    """
    if params.all_greedy:
        return logits.argmax(dim=-1)
    num_rows, positions, vocab = logits.shape
    if probs is None:
        probs = filtered_probs(logits, params)
    return sample_from_probs(probs.view(-1, vocab), params.repeat_rows(positions).generators).view(num_rows, positions)
