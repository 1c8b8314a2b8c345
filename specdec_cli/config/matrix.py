"""The support matrix as data: feature -> method -> Support(supported, reason).

``specdec check`` prints it and ``config/validate.py`` reads it; nothing else decides
which method supports what. Its columns are the methods of ``config/methods.py``'s table. Flipping a feature for every method is a one-line change
(e.g. ``"guided_decoding": _every(Support(False, PLANNED))``).
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec_cli.config.methods import method_names

@dataclass(frozen=True)
class Support:
    """Whether a method supports a feature, and why not (or a caveat when it does)."""

    supported: bool
    reason: str = ""


METHODS = method_names()
MODEL_BASED = method_names("model")
RETRIEVAL = method_names("retrieval")
NON_SPECULATIVE = method_names("none")
MAX_DRAFT_TOKENS = 16
MAX_TREE_NODES = 64  # method.max_total_draft_tokens

# feature key -> what it is called in messages
FEATURES: dict[str, str] = {
    "rejection_sampling": "rejection sampling",
    "relaxed_acceptance": "relaxed acceptance",
    "dynamic_draft_length": "dynamic draft length",
    "draft_vocab_mapping": "draft vocabulary mapping (d2t)",
    "tensor_parallel": "tensor parallelism",
    "attention_dp": "attention data parallelism",
    "context_parallel": "context parallelism",
    "guided_decoding": "guided decoding",
    "flashinfer_backend": "the flashinfer backend",
    "confidence_stop": "the confidence stop (method.draft_confidence)",
    "suffix_enhancer": "the suffix enhancer (method.suffix_enhancer)",
    "adaptive_skip": "adaptive skipping (method.adaptive_min_accept)",
    "draft_tree": "a dynamic draft tree (method.tree_topk > 1, method.max_total_draft_tokens)",
}

PLANNED = "not implemented yet (planned)"
NOTHING_TO_VERIFY = "method=none drafts nothing, so there is nothing to verify"
ONE_HOT_Q = (
    "a retrieval drafter has no proposal distribution of its own: it verifies with a "
    "one-hot q, which is strict acceptance"
)
TP_SHARDED = (
    "the target is sharded over attention heads, MLP features and the vocabulary "
    "(parallelism.tp <= the model's KV heads); every rank takes the same decisions"
)
TP_DRAFT = (
    "vocab-sharded draft logits are gathered (greedy: each rank's (max, argmax); sampled: "
    "all-gather); a separate draft model under 2B parameters is replicated, never gathered"
)
TP_REPLICATED_HEAD = (
    "the draft head keeps whole copies of the target's embedding / LM head (or its own reduced "
    "vocabulary) on every rank: its logits are replicated and never gathered"
)
TP_REPLICATED_DRAFT = "the draft model is replicated on every rank: its logits are never gathered"
ADP_REPLICAS = (
    "each rank runs a whole model replica on its round-robin share of the requests; "
    "no draft logits cross ranks"
)
CONFIDENCE_STOP = (
    "a request's chain stops after its first draft whose own probability is below method.draft_confidence "
    "(a tree: after the level where its spine, the chain's draft, does); the drafts sent are verified as always "
    "(lossless)"
)
NO_OWN_PROBABILITY = "a retrieval drafter has no probability of its own drafts (one-hot q) to stop on"
SUFFIX_OVERRIDE = (
    "where the request's own text has a suffix match of >= method.suffix_min_match tokens, the retrieval "
    "continuation replaces the model's drafts with a one-hot q (the q it was drawn from): rejection stays exact"
)
ALREADY_RETRIEVAL = "already a retrieval drafter: the enhancer adds suffix matches to a model drafter"
ADAPTIVE_SKIP = (
    "a request whose running acceptance is below method.adaptive_min_accept drafts nothing (probing again "
    "every method.adaptive_probe_every steps); lossless"
)
WHOLE_VOCAB_ROWS = (
    "the rejection sampler needs whole-vocabulary target rows per request on one rank "
    "(TensorRT-LLM refuses this combination too)"
)


def _every(support: Support, **per_method: Support) -> dict[str, Support]:
    """One row: ``support`` for every method unless ``per_method`` says otherwise."""
    unknown = set(per_method) - set(METHODS)
    if unknown:
        raise ValueError(f"support matrix names unknown methods: {sorted(unknown)}")
    return {method: per_method.get(method, support) for method in METHODS}


def _only(methods: tuple[str, ...], yes: Support, no: Support) -> dict[str, Support]:
    return {method: yes if method in methods else no for method in METHODS}


MATRIX: dict[str, dict[str, Support]] = {
    "rejection_sampling": _every(
        Support(True),
        none=Support(False, NOTHING_TO_VERIFY),
        ngram=Support(False, ONE_HOT_Q),
        suffix=Support(False, ONE_HOT_Q),
    ),
    "relaxed_acceptance": _only(
        ("mtp",),
        Support(True, "lossy (thinking-phase acceptance); excludes rejection sampling"),
        Support(False, "relaxed (thinking) acceptance is MTP-only"),
    ),
    "dynamic_draft_length": _every(Support(True), none=Support(False, NOTHING_TO_VERIFY)),
    "draft_vocab_mapping": _every(
        Support(False, "drafts in the target vocabulary (no d2t)"),
        none=Support(False, NOTHING_TO_VERIFY),
        eagle3=Support(True, "EAGLE-3 heads may draft in a reduced vocabulary mapped with d2t"),
    ),
    "tensor_parallel": _every(
        Support(True, TP_REPLICATED_HEAD),
        none=Support(True, TP_SHARDED),
        ngram=Support(True, TP_SHARDED),
        suffix=Support(True, TP_SHARDED),
        draft_target=Support(True, TP_DRAFT),
        pard=Support(True, TP_REPLICATED_DRAFT),
    ),
    "attention_dp": _every(Support(True, ADP_REPLICAS)),
    "context_parallel": _every(
        Support(False, f"not supported with speculative decoding: {WHOLE_VOCAB_ROWS}"),
        none=Support(False, PLANNED),
    ),
    "guided_decoding": _every(Support(False, "not implemented")),
    "flashinfer_backend": _only(
        MODEL_BASED,
        Support(True, "needs CUDA and an importable flashinfer (the gpu extra)"),
        Support(False, "no rejection sampling to run: strict acceptance runs in torch"),
    ),
    "confidence_stop": _every(
        Support(True, CONFIDENCE_STOP),
        none=Support(False, NOTHING_TO_VERIFY),
        ngram=Support(False, NO_OWN_PROBABILITY),
        suffix=Support(False, NO_OWN_PROBABILITY),
    ),
    "suffix_enhancer": _every(
        Support(True, SUFFIX_OVERRIDE),
        none=Support(False, NOTHING_TO_VERIFY),
        ngram=Support(False, ALREADY_RETRIEVAL),
        suffix=Support(False, ALREADY_RETRIEVAL),
    ),
    "adaptive_skip": _every(Support(True, ADAPTIVE_SKIP), none=Support(False, NOTHING_TO_VERIFY)),
    "draft_tree": _only(
        ("eagle3",),
        Support(True, "EAGLE-2 dynamic tree verified in one target forward with a tree attention mask; "
                      "lossless (traversal verification, or node-by-node tree rejection sampling with "
                      "rejection.verification=token); engine.max_batch_size=1; "
                      "on by default at batch 1 (tree_topk auto -> 2; 2K nodes for a greedy request, K + 1 "
                      "for a sampled one)"),
        Support(False, "only EAGLE-3 expands a draft tree (its head scores every node's children); "
                       "this drafter proposes a chain"),
    ),
}

# features that rejection sampling cannot be combined with, whatever the method
REJECTION_EXCLUSIONS: dict[str, str] = {
    "relaxed_acceptance": "relaxed acceptance is lossy and replaces the acceptance rule",
    "guided_decoding": (
        "the grammar mask changes the target distribution that rejection sampling must preserve"
    ),
    "context_parallel": WHOLE_VOCAB_ROWS,
}


def support(method: str, feature: str) -> Support:
    """The matrix cell for ``method`` × ``feature``."""
    return MATRIX[feature][method]
