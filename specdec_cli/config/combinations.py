"""Support-matrix rules: which features a run uses, which of them its method refuses, and the
rejection-sampling, backend, auto head-dtype, auto tree and auto draft-length-schedule choices (the only place
each is decided).

An explicit request the matrix refuses (``rejection=on``, ``rejection.backend=flashinfer``) is a violation;
``auto`` falls back and records why in ``Findings.reasons``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from specdec_cli.config.fields import check_tree, not_one_of
from specdec_cli.config.hardware import Hardware
from specdec_cli.config.matrix import FEATURES, REJECTION_EXCLUSIONS, support
from specdec_cli.config.methods import TABLE
from specdec_cli.config.schema import MethodConfig, RunConfig

REJECTION_MODES = ("auto", "on", "off")
BACKENDS = ("auto", "torch", "flashinfer")
VERIFICATIONS = ("auto", "token", "block")


@dataclass
class Findings:
    """What validation found so far: violations (errors) and reasons (silent decisions explained)."""

    violations: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def check_head_dtype(cfg: RunConfig) -> list[str]:
    """A weight-only int8 draft head runs on CPU only, like an int8 target."""
    if getattr(cfg.method, "head_dtype", None) == "int8" and cfg.model.device == "cuda":
        return ["method.head_dtype=int8 (weight-only int8) runs on CPU only; use model.device=cpu or another dtype"]
    return []


#: Learned heads whose auto head dtype on CPU is weight-only int8 (measured: the same greedy acceptance on unseen
#: prompt families and a draft step 40% cheaper; benchmarks/results_unseen.md). Others follow model.dtype.
INT8_HEAD_BY_DEFAULT = ("eagle3",)


def head_dtype_for(cfg: RunConfig, device: str) -> Optional[str]:
    """``method.head_dtype`` resolved: an explicit value, or auto (None): int8 for an ``INT8_HEAD_BY_DEFAULT``
    head on CPU with a float32 target; None (follow model.dtype) otherwise."""
    explicit = getattr(cfg.method, "head_dtype", None)
    if explicit is not None:
        return explicit
    if cfg.method.name in INT8_HEAD_BY_DEFAULT and device == "cpu" and cfg.model.dtype == "float32":
        return "int8"
    return None


def features_in_use(cfg: RunConfig) -> dict[str, bool]:
    """feature -> whether ``cfg`` asks for it (the matrix features a config can switch on)."""
    return {
        "relaxed_acceptance": cfg.method.relaxed_acceptance,
        "dynamic_draft_length": bool(cfg.method.draft_len_schedule),
        "tensor_parallel": cfg.parallelism.tp > 1,
        "attention_dp": cfg.parallelism.dp > 1,
        "context_parallel": cfg.parallelism.cp > 1,
        "guided_decoding": cfg.sampler.guided_decoding is not None,
        "confidence_stop": cfg.method.draft_confidence > 0,
        "suffix_enhancer": cfg.method.suffix_enhancer is True,  # auto (None) is never a violation
        "adaptive_skip": cfg.method.adaptive_min_accept > 0,
        "draft_tree": cfg.method.drafts_a_tree or cfg.method.max_total_draft_tokens is not None,
    }


AUTO_TREE_TOPK = 2
"""Children per node of the auto tree (EAGLE-3, batch 1). Greedy: topk 2 / 8 nodes measured at or above the chain
on every prompt set (held-out families 1.37-1.43x vs 1.31-1.34x, MT-Bench 1.33-1.38x vs 1.29x;
benchmarks/results_unseen_heldout_tree_sweep.md). Sampled, since tree rejection is compiled on CPU: topk 2 with
K + 1 nodes (AUTO_SAMPLED_TREE_EXTRA_NODES) mean 1.245x vs the chain's 1.217x over six seed sets on the held-out
families (ahead in five, level in one), while 8 nodes only matched the chain (benchmarks/results_protocol64.md)."""

AUTO_SAMPLED_TREE_EXTRA_NODES = 1
"""The auto tree's nodes beyond its depth K for a sampled request: the chain plus one sibling."""


def tree_topk_for(cfg: RunConfig, cuda_graphs: bool) -> int:
    """``method.tree_topk`` resolved: an explicit value, or auto (None, EAGLE-3): AUTO_TREE_TOPK where a tree can
    run here (``fields.check_tree`` finds nothing, no CUDA graphs), else 1."""
    if cfg.method.tree_topk is not None:
        return cfg.method.tree_topk
    can_tree = cfg.method.name in TABLE and support(cfg.method.name, "draft_tree").supported
    if cuda_graphs or not can_tree:
        return 1
    tree = dataclasses.replace(cfg, method=dataclasses.replace(cfg.method, tree_topk=AUTO_TREE_TOPK))
    return 1 if check_tree(tree) else AUTO_TREE_TOPK


def tree_nodes_for(method: MethodConfig, tree_topk: int, sampled: bool) -> int:
    """Nodes per tree verify of a greedy or a ``sampled`` request (0: the chain): ``method.max_total_draft_tokens``;
    by default tree_topk * num_draft_tokens, or for the auto tree's sampled requests num_draft_tokens + 1."""
    if tree_topk <= 1:
        return 0
    if method.max_total_draft_tokens:
        return method.max_total_draft_tokens
    if method.tree_topk is None and sampled:
        return method.num_draft_tokens + AUTO_SAMPLED_TREE_EXTRA_NODES
    return tree_topk * method.num_draft_tokens


AUTO_DRAFT_MAX_BATCH = {"eagle3": 2}
"""On CPU, the largest running batch in which a model drafter drafts when ``method.draft_len_schedule`` is left
empty (auto); 1 for model drafters not listed. A batch of several requests is compute-bound on CPU cores, so every
verify row costs. Measured over ``none`` (benchmarks/results_batch_auto.md, results_batch.md): the shipped
eagle3 1.02-1.16x at batch 2, 0.84-0.98x at 4, 0.67-0.71x at 16; MTP 0.79-0.88x at batch 2 (its draft step costs
3x eagle3's); suffix and ngram, which draft only where the text repeats, 1.00-1.02x at 4 (left alone)."""


def draft_len_schedule_for(cfg: RunConfig, device: str) -> dict[int, int]:
    """``method.draft_len_schedule`` resolved, sorted: an explicit (non-empty) schedule; or auto (empty): on CPU,
    for a model drafter whose engine may run batches above its AUTO_DRAFT_MAX_BATCH, K up to that batch size and
    0 above it; else {} (always K)."""
    if cfg.method.draft_len_schedule:
        return dict(sorted(cfg.method.draft_len_schedule.items()))
    model_drafter = cfg.method.name in TABLE and TABLE[cfg.method.name].family == "model"
    max_batch = AUTO_DRAFT_MAX_BATCH.get(cfg.method.name, 1)
    if device == "cpu" and model_drafter and cfg.engine.max_batch_size > max_batch:
        return {max_batch: cfg.method.num_draft_tokens}
    return {}


def suffix_enhancer_on(method: MethodConfig) -> bool:
    """``method.suffix_enhancer`` resolved: an explicit true/false, or auto (None): on for a model drafter,
    chain or tree (it measured +20% acceptance on unseen task families, never worse), off otherwise."""
    if method.suffix_enhancer is not None:
        return method.suffix_enhancer
    return method.name in TABLE and TABLE[method.name].family == "model"


def check_features(cfg: RunConfig) -> list[str]:
    """One violation per feature in use that the method does not support."""
    if cfg.method.name not in TABLE:
        return []  # already reported; the matrix has no row for it
    return [
        unsupported(cfg.method.name, feature)
        for feature, used in features_in_use(cfg).items()
        if used and not support(cfg.method.name, feature).supported
    ]


def resolve_rejection(cfg: RunConfig, found: Findings) -> bool:
    """Whether rejection sampling runs: ``on`` must be possible, ``auto`` turns off when it is not."""
    mode, block = cfg.rejection.mode, cfg.rejection.verification == "block"
    if cfg.rejection.verification not in VERIFICATIONS:
        found.violations.append(not_one_of("rejection.verification", cfg.rejection.verification, VERIFICATIONS))
    if mode not in REJECTION_MODES:
        found.violations.append(not_one_of("rejection.mode", mode, REJECTION_MODES))
        return False
    if mode == "off" and block:
        found.violations.append("rejection.verification=block is a rejection-sampling rule: rejection=off has none")
    if mode == "off" or cfg.method.name not in TABLE:
        return False
    blockers = []
    if not support(cfg.method.name, "rejection_sampling").supported:
        blockers.append(unsupported(cfg.method.name, "rejection_sampling"))
    in_use = features_in_use(cfg)
    blockers += [
        f"rejection sampling cannot be combined with {FEATURES[feature]}: {why}"
        for feature, why in REJECTION_EXCLUSIONS.items()
        if in_use[feature]
    ]
    if mode == "on":
        found.violations += blockers
        return True
    found.reasons += [f"rejection=auto -> off: {blocker}" for blocker in blockers]
    if blockers and block:
        found.reasons.append("rejection.verification=block has no effect: rejection sampling is off")
    return not blockers


CUDA_GRAPHS = ("auto", "on", "off")


def resolve_cuda_graphs(cfg: RunConfig, device: str, found: Findings) -> bool:
    """``engine.cuda_graphs``: auto -> on where the model runs on CUDA; on without CUDA is a violation."""
    requested = cfg.engine.cuda_graphs
    if requested not in CUDA_GRAPHS:
        found.violations.append(not_one_of("engine.cuda_graphs", requested, CUDA_GRAPHS))
        return False
    if requested == "on" and device != "cuda":
        found.violations.append("engine.cuda_graphs=on needs a CUDA device (model.device resolved to "
                                f"{device}); use engine.cuda_graphs=auto or off")
        return False
    if requested == "auto":
        found.reasons.append(f"engine.cuda_graphs=auto -> {'on' if device == 'cuda' else 'off (no CUDA)'}")
    return requested == "on" or (requested == "auto" and device == "cuda")


def resolve_backend(
    cfg: RunConfig, rejection: bool, device: str, hw: Hardware, found: Findings
) -> str:
    """The rejection-sampling backend: ``torch`` | ``flashinfer`` (``auto``: flashinfer when usable)."""
    requested, method = cfg.rejection.backend, cfg.method.name
    if requested not in BACKENDS:
        found.violations.append(not_one_of("rejection.backend", requested, BACKENDS))
        return "torch"
    if requested == "torch" or (requested == "auto" and not rejection):
        return "torch"
    if cfg.rejection.verification == "block":  # flashinfer's chain kernel tests token by token
        if requested == "flashinfer":
            found.violations.append("rejection.verification=block runs on the torch backend: flashinfer's chain "
                                    "kernel verifies token by token (use rejection.backend=torch or auto)")
        elif device == "cuda":
            found.reasons.append("rejection.backend=auto -> torch (rejection.verification=block)")
        return "torch"
    problem = hw.flashinfer_problem
    if problem is None and device != "cuda":
        problem = "flashinfer needs model.device=cuda"
    if requested == "auto":
        if problem:
            found.reasons.append(f"rejection.backend=auto -> torch ({problem})")
            return "torch"
        found.reasons.append("rejection.backend=auto -> flashinfer")
        return "flashinfer"
    if method in TABLE and not support(method, "flashinfer_backend").supported:
        found.violations.append(unsupported(method, "flashinfer_backend"))
    elif not rejection:
        found.violations.append("rejection.backend=flashinfer but rejection sampling is off")
    elif problem:
        found.violations.append(f"rejection.backend=flashinfer is unavailable: {problem}")
    return "flashinfer"


def resolve_verification(cfg: RunConfig, rejection: bool, backend: str, tree_topk: int, found: Findings) -> str:
    """How drafts are tested: ``block`` (a chain: block verification; a tree, ``tree_topk`` > 1: traversal
    verification; both exact and keeping more drafts on average) or ``token`` (token by token /
    node by node); auto: block, except a chain on flashinfer (its chain kernel tests token by token; trees are
    walked on the host whatever the backend). An invalid value was reported by ``resolve_rejection``; an explicit
    block on flashinfer by ``resolve_backend``."""
    requested = cfg.rejection.verification
    if requested != "auto":
        return requested if requested in VERIFICATIONS else "token"
    resolved = "token" if backend == "flashinfer" and tree_topk <= 1 else "block"
    if rejection:
        rule = ("a draft tree is verified path by path (traversal verification" if tree_topk > 1 else
                "a draft chain is verified as a whole (block verification")
        why = ("flashinfer's chain kernel tests token by token" if resolved == "token" else
               f"{rule}: exact; keeps more drafts than token by token on average)")
        found.reasons.append(f"rejection.verification=auto -> {resolved}: {why}")
    return resolved


def unsupported(method: str, feature: str) -> str:
    """The message for a matrix cell that refuses ``feature``."""
    reason = support(method, feature).reason
    return f"method={method} does not support {FEATURES[feature]}: {reason}"


