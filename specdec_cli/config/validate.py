"""Validate a ``RunConfig`` against the rules and the support matrix; resolve every ``auto``.

``resolve`` checks every rule, collects all violations and raises one ``ConfigError``
listing them: field and range checks (``config/fields.py``), the support-matrix rules and the
rejection / backend choices (``config/combinations.py``), the device here. Knows nothing about
models, drafters or kernels.
"""
from __future__ import annotations

from specdec_cli.config.combinations import (
    Findings,
    check_features,
    check_head_dtype,
    draft_len_schedule_for,
    head_dtype_for,
    resolve_backend,
    resolve_cuda_graphs,
    resolve_rejection,
    resolve_verification,
    suffix_enhancer_on,
    tree_nodes_for,
    tree_topk_for,
)
from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.fields import (
    check_engine,
    check_method,
    check_model,
    check_objective,
    check_parallelism,
    check_sampler,
    check_single_process,
    check_tree,
    check_workload,
    request_samplers,
)
from specdec_cli.config.hardware import Hardware, probe_hardware
from specdec_cli.config.schema import RunConfig
from specdec_cli.errors import ConfigError

PER_REQUEST_SAMPLING_SOURCES = ("jsonl",)  # rows may carry their own temperature


def resolve(cfg: RunConfig, hardware: Hardware | None = None) -> EffectiveConfig:
    """Check every rule and resolve ``auto`` choices; raise one ``ConfigError`` with all problems.

    ``hardware`` defaults to probing this machine (tests pass their own).
    """
    hw = hardware if hardware is not None else probe_hardware()
    found = Findings()
    samplers, mix_problems = request_samplers(cfg.sampler, cfg.workload.sampler_mix)
    found.violations += check_sampler(cfg.sampler, "sampler") + mix_problems
    found.violations += check_method(cfg.method)
    found.violations += check_workload(cfg.workload)
    found.violations += check_model(cfg.model) + check_head_dtype(cfg)
    found.violations += check_engine(cfg.engine, cfg.workload)
    found.violations += check_parallelism(cfg.parallelism) + check_single_process(cfg)
    found.violations += check_objective(cfg.objective)
    found.violations += check_features(cfg)
    found.violations += check_tree(cfg)
    device = _resolve_device(cfg.model.device, hw, found)
    rejection = resolve_rejection(cfg, found)
    backend = resolve_backend(cfg, rejection, device, hw, found)
    cuda_graphs = resolve_cuda_graphs(cfg, device, found)
    enhancer = suffix_enhancer_on(cfg.method)
    head_dtype = head_dtype_for(cfg, device)
    if head_dtype is not None and getattr(cfg.method, "head_dtype", None) is None:
        found.reasons.append(f"method.head_dtype=auto -> {head_dtype}: weight-only int8 head on CPU "
                             "(the same greedy acceptance, a 40% cheaper draft step)")
    if cfg.method.suffix_enhancer is None and enhancer:  # auto resolved on (a model drafter)
        found.reasons.append("method.suffix_enhancer=auto -> on: a request's own suffix matches of >= "
                             "method.suffix_min_match tokens replace the model's drafts (a tree's: by a chain)")
    fixed_sampling = cfg.workload.source not in PER_REQUEST_SAMPLING_SOURCES
    all_greedy = all(s.temperature == 0 for s in samplers) and fixed_sampling
    all_sampled = all(s.temperature > 0 for s in samplers) and fixed_sampling
    tree_topk = tree_topk_for(cfg, cuda_graphs)
    verification = resolve_verification(cfg, rejection, backend, tree_topk, found)
    tree_nodes = tree_nodes_for(cfg.method, tree_topk, sampled=False)
    sampled_tree_nodes = tree_nodes_for(cfg.method, tree_topk, sampled=True)
    if cfg.method.tree_topk is None:
        found.reasons.append(
            f"method.tree_topk=auto -> {tree_topk}: " + (
                f"batch 1: a dynamic draft tree of {tree_nodes} nodes for a greedy request, {sampled_tree_nodes} "
                "for a sampled one (method.max_total_draft_tokens; auto: tree_topk * num_draft_tokens greedy, "
                "num_draft_tokens + 1 sampled) accepts more than the chain" if tree_topk > 1 else
                "the chain (a tree runs only at engine.max_batch_size=1, on one process, without "
                f"method.adaptive_min_accept or CUDA graphs)"))
    schedule = draft_len_schedule_for(cfg, device)
    if schedule and not cfg.method.draft_len_schedule:
        found.reasons.append(
            f"method.draft_len_schedule=auto -> {schedule}: on CPU a batch of more than {max(schedule)} "
            f"request{'s' if max(schedule) > 1 else ''} is compute-bound and {cfg.method.name}'s drafts cost more "
            "there than they save (such batches decode without drafts; to draft at every batch size give a schedule, e.g. "
            f"++method.draft_len_schedule={{{cfg.engine.max_batch_size}:{cfg.method.num_draft_tokens}}})")
    if rejection and all_greedy:
        found.reasons.append(
            "all requests are greedy (temperature 0): every batch takes the argmax fast path "
            "and rejection sampling never runs"
        )
    if cfg.method.relaxed_acceptance:
        begin = getattr(cfg.method, "begin_thinking_token_id", None)
        end = getattr(cfg.method, "end_thinking_token_id", None)
        found.reasons.append(f"relaxed acceptance (lossy) only inside the thinking phase, between token ids "
                             f"{begin} and {end}; strict elsewhere" if begin is not None else
                             "relaxed acceptance (lossy) on every token (method.relaxed_everywhere=true)")
    if found.violations:
        raise ConfigError(found.violations)
    return EffectiveConfig(
        rejection=rejection,
        relaxed_acceptance=cfg.method.relaxed_acceptance,
        backend=backend,
        verification=verification,
        device=device,
        cuda_graphs=cuda_graphs,
        suffix_enhancer=enhancer,
        head_dtype=head_dtype,
        tree_topk=tree_topk,
        tree_nodes=tree_nodes,
        sampled_tree_nodes=sampled_tree_nodes,
        draft_len_schedule=schedule,
        all_greedy=all_greedy,
        all_sampled=all_sampled,
        reasons=found.reasons,
    )


def _resolve_device(requested: str, hw: Hardware, found: Findings) -> str:
    if requested == "auto":
        device = "cuda" if hw.cuda else "cpu"
        found.reasons.append(f"model.device=auto -> {device}" + ("" if hw.cuda else " (no CUDA)"))
        return device
    if requested == "cuda" and not hw.cuda:
        found.violations.append("model.device=cuda but no CUDA device is available")
    return requested
