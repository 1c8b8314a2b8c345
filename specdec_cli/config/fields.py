"""Field and range checks of a ``RunConfig``: what each value may be, one message per problem.

Each ``check_*`` returns its violations (empty: fine); ``config/validate.py`` collects them. Which methods
support which features is ``config/combinations.py``'s concern.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from specdec_cli.config.hub import is_repo_id, not_cached
from specdec_cli.config.matrix import MAX_DRAFT_TOKENS, MAX_TREE_NODES, NON_SPECULATIVE
from specdec_cli.config.methods import method_schemas
from specdec_cli.config.schema import (
    EngineConfig,
    HfModelConfig,
    MethodConfig,
    ModelConfig,
    ParallelismConfig,
    RunConfig,
    SamplerConfig,
    WorkloadConfig,
)
from specdec_cli.errors import seed_problem

DRAFT_POLICIES = ("sample", "argmax")
OBJECTIVES = ("tokens_per_s", "acceptance_length")  # what a Hydra job returns with objective=...
DTYPES = ("float32", "bfloat16", "int8")  # int8: weight-only, CPU (models/quantize.py)
DEVICES = ("auto", "cpu", "cuda")
# workload.source -> whether it reads workload.path (jsonl, spec_bench require it; mt_bench: None = bundled)
WORKLOAD_SOURCES = {"builtin": False, "mt_bench": True, "jsonl": True, "repetitive": False, "inline": False,
                    "spec_bench": True}
# optional method fields (present on some method schemas) -> smallest legal value
METHOD_MINIMA = {
    "relaxed_topk": 1,
    "min_n": 1,
    "max_n": 1,
    "min_match_len": 1,
    "max_pool_tokens": 1,
    "self_speculative_layers": 1,
    "mask_token_id": 0,
    "suffix_min_match": 1,
    "adaptive_probe_every": 1,
}
METHOD_PATHS = ("draft_path", "checkpoint")
# keys a workload.sampler_mix entry may override, with their types
MIX_TYPES: dict[str, tuple[type, ...]] = {
    "temperature": (int, float),
    "top_k": (int,),
    "top_p": (int, float),
    "seed": (int,),
    "max_new_tokens": (int,),
}


def check_method(method: MethodConfig) -> list[str]:
    name, schemas = method.name, method_schemas()
    if name not in schemas:
        return [f"method.name={name} is not a method (choose one of: {', '.join(schemas)})"]
    out = []
    if type(method) is not schemas[name]:
        out.append(
            f"method.name={name} does not match the chosen option ({type(method).__name__}): "
            f"choose the method with method={name}"
        )
    low, high = (0, 0) if name in NON_SPECULATIVE else (1, MAX_DRAFT_TOKENS)
    k = method.num_draft_tokens
    if not low <= k <= high:
        out.append(f"method.num_draft_tokens={k} is out of range for method={name} ({low}..{high})")
    out += _check_schedule(method.draft_len_schedule, k)
    if method.draft_policy not in DRAFT_POLICIES:
        out.append(not_one_of("method.draft_policy", method.draft_policy, DRAFT_POLICIES))
    head_dtype = getattr(method, "head_dtype", None)
    if head_dtype is not None and head_dtype not in DTYPES:
        out.append(not_one_of("method.head_dtype", head_dtype, DTYPES))
    if method.relaxed_delta < 0:
        out.append(f"method.relaxed_delta={method.relaxed_delta} must be >= 0")
    if not 0 <= method.draft_confidence < 1:
        out.append(f"method.draft_confidence={method.draft_confidence} must be in [0, 1) (0 = off)")
    if method.adaptive_min_accept < 0:
        out.append(f"method.adaptive_min_accept={method.adaptive_min_accept} must be >= 0 (0 = off)")
    out += _check_tree_size(method)
    out += _check_thinking(method)
    for attr, low in METHOD_MINIMA.items():
        value = getattr(method, attr, None)
        if value is not None and value < low:
            out.append(f"method.{attr}={value} must be >= {low}")
    min_n, max_n = getattr(method, "min_n", None), getattr(method, "max_n", None)
    if min_n is not None and max_n is not None and max_n < min_n:
        out.append(f"method.max_n={max_n} must be >= method.min_n={min_n}")
    for layer in getattr(method, "target_layers", None) or []:
        if layer < 0:
            out.append(f"method.target_layers: layer {layer} must be >= 0")
    out += [missing_model_path(f"method.{attr}", getattr(method, attr, None)) for attr in METHOD_PATHS]
    return [line for line in out if line]


def _check_thinking(method: MethodConfig) -> list[str]:
    """Relaxed (MTP) acceptance is gated by the thinking-phase token ids, or explicitly everywhere."""
    if not hasattr(method, "relaxed_everywhere"):
        return []  # not MTP: the support matrix refuses relaxed acceptance
    begin, end, everywhere = method.begin_thinking_token_id, method.end_thinking_token_id, method.relaxed_everywhere
    out = [f"method.{name}_thinking_token_id={value} must be >= 0"
           for name, value in (("begin", begin), ("end", end)) if value is not None and value < 0]
    if (begin is None) != (end is None) or (begin is not None and begin == end):
        out.append("method.begin_thinking_token_id and method.end_thinking_token_id go together and must differ")
    elif everywhere and begin is not None:
        out.append("method.relaxed_everywhere=true contradicts the thinking token ids: give one or the other")
    elif method.relaxed_acceptance and begin is None and not everywhere:
        out.append("method.relaxed_acceptance=true applies only inside the thinking phase: set "
                   "method.begin_thinking_token_id and method.end_thinking_token_id, or "
                   "method.relaxed_everywhere=true for a model without thinking tokens (lossy on every token)")
    return out


def _check_tree_size(method: MethodConfig) -> list[str]:
    out = []
    if method.tree_topk is not None and method.tree_topk < 1:
        out.append(f"method.tree_topk={method.tree_topk} must be >= 1 (1 = the chain)")
    total = method.max_total_draft_tokens
    if total is not None and not method.num_draft_tokens <= total <= MAX_TREE_NODES:
        out.append(f"method.max_total_draft_tokens={total} must be in {method.num_draft_tokens}..{MAX_TREE_NODES} "
                   f"(at least the tree depth, method.num_draft_tokens={method.num_draft_tokens})")
    return out


def check_tree(cfg: RunConfig) -> list[str]:
    """What a dynamic draft tree (method.tree_topk > 1) cannot be combined with (yet)."""
    if not cfg.method.drafts_a_tree:
        return []
    why = "method.tree_topk > 1 (a dynamic draft tree)"
    out = []
    if cfg.engine.max_batch_size != 1:
        out.append(f"{why} verifies one request at a time: set engine.max_batch_size=1 "
                   f"(got {cfg.engine.max_batch_size}; batched trees are not implemented)")
    if cfg.parallelism.tp > 1 or cfg.parallelism.dp > 1 or cfg.parallelism.cp > 1:
        out.append(f"{why} runs on a single process: parallelism.tp/dp/cp must be 1")
    if cfg.rejection.mode == "off":
        out.append(f"{why} always verifies with rejection sampling (lossless): rejection=off is not supported")
    if cfg.method.adaptive_min_accept:
        out.append(f"{why} cannot be combined with method.adaptive_min_accept (the tree engine does not apply it)")
    return out


def _check_schedule(schedule: dict[int, int], k: int) -> list[str]:
    if not schedule:
        return []
    out = []
    if min(schedule) < 1:
        out.append(f"method.draft_len_schedule: batch sizes must be >= 1, got {min(schedule)}")
    for batch_size, length in sorted(schedule.items()):
        if not 0 <= length <= k:
            out.append(
                f"method.draft_len_schedule[{batch_size}]={length} is outside "
                f"0..{k} (method.num_draft_tokens)"
            )
    smallest = min(schedule)
    if schedule[smallest] != k:
        out.append(
            f"method.draft_len_schedule: the smallest batch size ({smallest}) must map to "
            f"method.num_draft_tokens={k}, got {schedule[smallest]}"
        )
    return out


def check_sampler(sampler: SamplerConfig, where: str) -> list[str]:
    out = []
    if sampler.temperature < 0:
        out.append(f"{where}.temperature={sampler.temperature} must be >= 0 (0 = greedy)")
    if sampler.top_k < 0:
        out.append(f"{where}.top_k={sampler.top_k} must be >= 0 (0 = off)")
    if not 0 < sampler.top_p <= 1:
        out.append(f"{where}.top_p={sampler.top_p} must be in (0, 1] (1 = off)")
    if problem := seed_problem(sampler.seed, f"{where}.seed"):
        out.append(problem)
    return out


def request_samplers(
    base: SamplerConfig, mix: list[dict[str, Any]]
) -> tuple[list[SamplerConfig], list[str]]:
    """The per-request samplers (``base``, or each valid sampler_mix entry applied to it)
    and the problems of the invalid entries."""
    samplers, problems = [], []
    for i, entry in enumerate(mix):
        where = f"workload.sampler_mix[{i}]"
        bad = [line for key, value in entry.items() if (line := _mix_problem(where, key, value))]
        if bad:
            problems += bad
            continue
        params = dict(entry)
        if params.pop("max_new_tokens", 1) <= 0:
            problems.append(f"{where}.max_new_tokens={entry['max_new_tokens']} must be > 0")
        sampler = dataclasses.replace(base, **params)
        problems += check_sampler(sampler, where)
        samplers.append(sampler)
    return samplers or [base], problems


def _mix_problem(where: str, key: str, value: object) -> str:
    if key not in MIX_TYPES:
        return f"{where}: unknown key '{key}' (allowed: {', '.join(MIX_TYPES)})"
    if isinstance(value, bool) or not isinstance(value, MIX_TYPES[key]):
        return f"{where}.{key}={value!r} must be a number"
    return ""


def check_workload(workload: WorkloadConfig) -> list[str]:
    if workload.source not in WORKLOAD_SOURCES:
        return [not_one_of("workload.source", workload.source, tuple(WORKLOAD_SOURCES))]
    out = []
    if workload.source in ("jsonl", "spec_bench") and workload.path is None:
        out.append(f"workload.source={workload.source} needs workload.path=<{workload.source}.jsonl>")
    if workload.path is not None and not WORKLOAD_SOURCES[workload.source]:
        out.append(f"workload.path is not read by workload.source={workload.source}")
    if workload.source == "inline" and not workload.prompts:  # prompts of another source are ignored
        out.append("workload.source=inline needs workload.prompts=[...]")
    if workload.max_new_tokens <= 0:
        out.append(f"workload.max_new_tokens={workload.max_new_tokens} must be > 0")
    out.append(missing_path("workload.path", workload.path))
    return [line for line in out if line]


def check_model(model: ModelConfig) -> list[str]:
    out = []
    if model.dtype not in DTYPES:
        out.append(not_one_of("model.dtype", model.dtype, DTYPES))
    if model.dtype == "int8" and model.device == "cuda":
        out.append("model.dtype=int8 (weight-only int8) runs on CPU only; use model.device=cpu or another dtype")
    if model.device not in DEVICES:
        out.append(not_one_of("model.device", model.device, DEVICES))
    if isinstance(model, HfModelConfig) and model.path is None:
        out.append("model=hf needs model.path=<HF directory or .gguf file>")
    path = model.path
    if path is not None and Path(path).is_file() and Path(path).suffix != ".gguf":
        out.append(f"model.path={path} must be a HF directory or a .gguf file")
    out.append(missing_model_path("model.path", path))
    return [line for line in out if line]


def check_engine(engine: EngineConfig, workload: WorkloadConfig) -> list[str]:
    out = []
    for name in ("max_batch_size", "max_seq_len"):
        value = getattr(engine, name)
        if value <= 0:
            out.append(f"engine.{name}={value} must be > 0")
    if 0 < engine.max_seq_len <= workload.max_new_tokens:
        out.append(
            f"workload.max_new_tokens={workload.max_new_tokens} leaves no room for the prompt "
            f"in engine.max_seq_len={engine.max_seq_len}"
        )
    return out


def check_parallelism(parallelism: ParallelismConfig) -> list[str]:
    out = [
        f"parallelism.{name}={getattr(parallelism, name)} must be >= 1"
        for name in ("tp", "dp", "cp")
        if getattr(parallelism, name) < 1
    ]
    if parallelism.tp > 1 and parallelism.dp > 1:
        out.append(
            f"parallelism.tp={parallelism.tp} with parallelism.dp={parallelism.dp}: tensor parallelism "
            "and attention data parallelism cannot be combined yet (use one of them)"
        )
    return out


def check_single_process(cfg: RunConfig) -> list[str]:
    """``baseline`` and ``profile`` measure one process: refused with a parallel run."""
    if cfg.parallelism.tp <= 1 and cfg.parallelism.dp <= 1:
        return []
    why = {"baseline": "has no autoregressive baseline", "profile": "is not profiled (one trace per process)"}
    return [f"{flag}=true runs in a single process; parallelism={cfg.parallelism.name} {reason} "
            "(use parallelism=single)" for flag, reason in why.items() if getattr(cfg, flag)]


def not_one_of(key: str, value: object, allowed: tuple[str, ...]) -> str:
    """The message for a value outside its allowed choices."""
    return f"{key}={value} is not one of: {', '.join(allowed)}"


def missing_path(key: str, path: str | None) -> str:
    """The message for a path that does not exist ("" when it is unset or exists)."""
    if path is None or Path(path).exists():
        return ""
    return f"{key}={path} does not exist"


def missing_model_path(key: str, path: str | None) -> str:
    """``missing_path`` for a model or checkpoint, which may also be a Hugging Face repo id (config/hub.py)."""
    return not_cached(key, path) if path is not None and is_repo_id(path) else missing_path(key, path)


def check_objective(objective: str | None) -> list[str]:
    return [] if objective is None or objective in OBJECTIVES else [not_one_of("objective", objective, OBJECTIVES)]
