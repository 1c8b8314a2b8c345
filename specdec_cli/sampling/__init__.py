"""Sampling and acceptance core: pure tensor functions, no model, no config, no hidden state.

Vocabulary (used in names and docs; never ``p``/``q`` in code):
- ``target_probs`` [B, K+1, V]: the target's filtered distributions at the K draft positions plus the bonus row.
- ``draft_probs`` [B, K, V]: the distribution each draft token was *actually drawn from* (one-hot for argmax
  and retrieval drafters).
- **accepted** token: a draft that passed its test and is emitted as is.
- **recovered** token: drawn at the first rejected position from normalize(max(target - draft, 0)).
- **bonus** token: drawn from the last target row when all K drafts are accepted.
- Every step emits the accepted prefix plus one recovered or bonus token: ``tokens [B, K+1]`` padded with
  ``PLACEHOLDER_TOKEN_ID = -1`` and ``num_emitted [B]`` in 1..K+1.

Draft provenance: draft-side sampling must use the same ``probs_from_logits`` (top-k -> temperature softmax ->
top-p) and draw the draft token with ``sample_from_probs`` from exactly the probs it then stores as
draft_probs; pairing a softmax draft_probs with an argmax draft silently breaks losslessness.

Randomness: every random function takes ``generators``: None, one ``torch.Generator`` for the batch, or a
list with one (possibly None) generator per row, on the device of the probabilities. With the list, row i's
draws depend only on its generator and its own inputs, so a seeded request gets the same tokens whatever else
is in the batch. Each call consumes a fixed number of draws per row (1 for ``sample_from_probs``, K+1 for
``rejection_sample`` and ``block_verify``), so a request's stream advances identically however the batch is composed.
"""
from __future__ import annotations

from specdec_cli.sampling.acceptance import (
    PLACEHOLDER_TOKEN_ID,
    block_verify,
    greedy_accept,
    rejection_sample,
    relaxed_accept,
    strict_accept,
    thinking_mask,
)
from specdec_cli.sampling.backend import rejection_sample_with
from specdec_cli.sampling.draws import Generators, draw_uniforms, sample_from_probs
from specdec_cli.sampling.params import BatchParams
from specdec_cli.sampling.probs import SamplingError, probs_from_logits
from specdec_cli.sampling.reference import rejection_sample_reference
from specdec_cli.sampling.sample import filtered_probs, sample_tokens
from specdec_cli.sampling.vocab import draft_ids_of, draft_to_target_ids, expand_draft_probs, one_hot

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "BatchParams",
    "Generators",
    "SamplingError",
    "block_verify",
    "draft_ids_of",
    "draft_to_target_ids",
    "draw_uniforms",
    "expand_draft_probs",
    "filtered_probs",
    "greedy_accept",
    "one_hot",
    "probs_from_logits",
    "rejection_sample",
    "rejection_sample_reference",
    "rejection_sample_with",
    "relaxed_accept",
    "sample_from_probs",
    "sample_tokens",
    "strict_accept",
    "thinking_mask",
]
