"""Validate a ``RunConfig`` against the rules and the support matrix; resolve every ``auto``.

``resolve`` checks every rule, collects all violations and raises one ``ConfigError``
listing them. An explicit request the matrix refuses (``rejection=on``,
``rejection.backend=flashinfer``) is an error; ``auto`` falls back silently and records
why in ``EffectiveConfig.reasons``. Knows nothing about models, drafters or kernels.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.hardware import Hardware, probe_hardware
from specdec_cli.config.matrix import (
    FEATURES,
    MAX_DRAFT_TOKENS,
    NON_SPECULATIVE,
    REJECTION_EXCLUSIONS,
    support,
)
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
from specdec_cli.config.store import METHOD_SCHEMAS
from specdec_cli.errors import ConfigError

DRAFT_POLICIES = ("sample", "argmax")
DTYPES = ("float32", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
REJECTION_MODES = ("auto", "on", "off")
BACKENDS = ("auto", "torch", "flashinfer")
# workload.source -> whether it reads workload.path (jsonl requires it; mt_bench: None = bundled)
WORKLOAD_SOURCES = {"builtin": False, "mt_bench": True, "jsonl": True, "repetitive": False}
PER_REQUEST_SAMPLING_SOURCES = ("jsonl",)  # rows may carry their own temperature
# optional method fields (present on some method schemas) -> smallest legal value
METHOD_MINIMA = {
    "relaxed_topk": 1,
    "min_n": 1,
    "max_n": 1,
    "min_match_len": 1,
    "max_pool_tokens": 1,
    "self_speculative_layers": 1,
    "mask_token_id": 0,
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


@dataclass
class _Findings:
    violations: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def resolve(cfg: RunConfig, hardware: Hardware | None = None) -> EffectiveConfig:
    """Check every rule and resolve ``auto`` choices; raise one ``ConfigError`` with all problems.

    ``hardware`` defaults to probing this machine (tests pass their own).
    """
    hw = hardware if hardware is not None else probe_hardware()
    found = _Findings()
    samplers, mix_problems = _request_samplers(cfg.sampler, cfg.workload.sampler_mix)
    found.violations += _check_sampler(cfg.sampler, "sampler") + mix_problems
    found.violations += _check_method(cfg.method)
    found.violations += _check_workload(cfg.workload)
    found.violations += _check_model(cfg.model)
    found.violations += _check_engine(cfg.engine, cfg.workload)
    found.violations += _check_parallelism(cfg.parallelism)
    found.violations += _check_features(cfg)
    device = _resolve_device(cfg.model.device, hw, found)
    rejection = _resolve_rejection(cfg, found)
    backend = _resolve_backend(cfg, rejection, device, hw, found)
    all_greedy = all(s.temperature == 0 for s in samplers) and (
        cfg.workload.source not in PER_REQUEST_SAMPLING_SOURCES
    )
    if rejection and all_greedy:
        found.reasons.append(
            "all requests are greedy (temperature 0): every batch takes the argmax fast path "
            "and rejection sampling never runs"
        )
    if found.violations:
        raise ConfigError(found.violations)
    return EffectiveConfig(
        rejection=rejection,
        relaxed_acceptance=cfg.method.relaxed_acceptance,
        backend=backend,
        device=device,
        draft_len_schedule=dict(sorted(cfg.method.draft_len_schedule.items())),
        all_greedy=all_greedy,
        reasons=found.reasons,
    )


def _check_method(method: MethodConfig) -> list[str]:
    name = method.name
    if name not in METHOD_SCHEMAS:
        return [f"method.name={name} is not a method (choose one of: {', '.join(METHOD_SCHEMAS)})"]
    out = []
    if type(method) is not METHOD_SCHEMAS[name]:
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
        out.append(_not_one_of("method.draft_policy", method.draft_policy, DRAFT_POLICIES))
    if method.relaxed_delta < 0:
        out.append(f"method.relaxed_delta={method.relaxed_delta} must be >= 0")
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
    out += [_missing_path(f"method.{attr}", getattr(method, attr, None)) for attr in METHOD_PATHS]
    return [line for line in out if line]


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


def _check_sampler(sampler: SamplerConfig, where: str) -> list[str]:
    out = []
    if sampler.temperature < 0:
        out.append(f"{where}.temperature={sampler.temperature} must be >= 0 (0 = greedy)")
    if sampler.top_k < 0:
        out.append(f"{where}.top_k={sampler.top_k} must be >= 0 (0 = off)")
    if not 0 < sampler.top_p <= 1:
        out.append(f"{where}.top_p={sampler.top_p} must be in (0, 1] (1 = off)")
    return out


def _request_samplers(
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
        problems += _check_sampler(sampler, where)
        samplers.append(sampler)
    return samplers or [base], problems


def _mix_problem(where: str, key: str, value: object) -> str:
    if key not in MIX_TYPES:
        return f"{where}: unknown key '{key}' (allowed: {', '.join(MIX_TYPES)})"
    if isinstance(value, bool) or not isinstance(value, MIX_TYPES[key]):
        return f"{where}.{key}={value!r} must be a number"
    return ""


def _check_workload(workload: WorkloadConfig) -> list[str]:
    if workload.source not in WORKLOAD_SOURCES:
        return [_not_one_of("workload.source", workload.source, tuple(WORKLOAD_SOURCES))]
    out = []
    if workload.source == "jsonl" and workload.path is None:
        out.append("workload.source=jsonl needs workload.path=<prompts.jsonl>")
    if workload.path is not None and not WORKLOAD_SOURCES[workload.source]:
        out.append(f"workload.path is not read by workload.source={workload.source}")
    if workload.max_new_tokens <= 0:
        out.append(f"workload.max_new_tokens={workload.max_new_tokens} must be > 0")
    out.append(_missing_path("workload.path", workload.path))
    return [line for line in out if line]


def _check_model(model: ModelConfig) -> list[str]:
    out = []
    if model.dtype not in DTYPES:
        out.append(_not_one_of("model.dtype", model.dtype, DTYPES))
    if model.device not in DEVICES:
        out.append(_not_one_of("model.device", model.device, DEVICES))
    if isinstance(model, HfModelConfig) and model.path is None:
        out.append("model=hf needs model.path=<HF directory or .gguf file>")
    path = model.path
    if path is not None and Path(path).is_file() and Path(path).suffix != ".gguf":
        out.append(f"model.path={path} must be a HF directory or a .gguf file")
    out.append(_missing_path("model.path", path))
    return [line for line in out if line]


def _check_engine(engine: EngineConfig, workload: WorkloadConfig) -> list[str]:
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


def _check_parallelism(parallelism: ParallelismConfig) -> list[str]:
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


def _features_in_use(cfg: RunConfig) -> dict[str, bool]:
    return {
        "relaxed_acceptance": cfg.method.relaxed_acceptance,
        "dynamic_draft_length": bool(cfg.method.draft_len_schedule),
        "tensor_parallel": cfg.parallelism.tp > 1,
        "attention_dp": cfg.parallelism.dp > 1,
        "context_parallel": cfg.parallelism.cp > 1,
        "guided_decoding": cfg.sampler.guided_decoding is not None,
    }


def _check_features(cfg: RunConfig) -> list[str]:
    if cfg.method.name not in METHOD_SCHEMAS:
        return []  # already reported; the matrix has no row for it
    return [
        _unsupported(cfg.method.name, feature)
        for feature, used in _features_in_use(cfg).items()
        if used and not support(cfg.method.name, feature).supported
    ]


def _resolve_device(requested: str, hw: Hardware, found: _Findings) -> str:
    if requested == "auto":
        device = "cuda" if hw.cuda else "cpu"
        found.reasons.append(f"model.device=auto -> {device}" + ("" if hw.cuda else " (no CUDA)"))
        return device
    if requested == "cuda" and not hw.cuda:
        found.violations.append("model.device=cuda but no CUDA device is available")
    return requested


def _resolve_rejection(cfg: RunConfig, found: _Findings) -> bool:
    mode = cfg.rejection.mode
    if mode not in REJECTION_MODES:
        found.violations.append(_not_one_of("rejection.mode", mode, REJECTION_MODES))
        return False
    if mode == "off" or cfg.method.name not in METHOD_SCHEMAS:
        return False
    blockers = []
    if not support(cfg.method.name, "rejection_sampling").supported:
        blockers.append(_unsupported(cfg.method.name, "rejection_sampling"))
    in_use = _features_in_use(cfg)
    blockers += [
        f"rejection sampling cannot be combined with {FEATURES[feature]}: {why}"
        for feature, why in REJECTION_EXCLUSIONS.items()
        if in_use[feature]
    ]
    if mode == "on":
        found.violations += blockers
        return True
    found.reasons += [f"rejection=auto -> off: {blocker}" for blocker in blockers]
    return not blockers


def _resolve_backend(
    cfg: RunConfig, rejection: bool, device: str, hw: Hardware, found: _Findings
) -> str:
    requested, method = cfg.rejection.backend, cfg.method.name
    if requested not in BACKENDS:
        found.violations.append(_not_one_of("rejection.backend", requested, BACKENDS))
        return "torch"
    if requested == "torch" or (requested == "auto" and not rejection):
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
    if method in METHOD_SCHEMAS and not support(method, "flashinfer_backend").supported:
        found.violations.append(_unsupported(method, "flashinfer_backend"))
    elif not rejection:
        found.violations.append("rejection.backend=flashinfer but rejection sampling is off")
    elif problem:
        found.violations.append(f"rejection.backend=flashinfer is unavailable: {problem}")
    return "flashinfer"


def _unsupported(method: str, feature: str) -> str:
    reason = support(method, feature).reason
    return f"method={method} does not support {FEATURES[feature]}: {reason}"


def _not_one_of(key: str, value: object, allowed: tuple[str, ...]) -> str:
    return f"{key}={value} is not one of: {', '.join(allowed)}"


def _missing_path(key: str, path: str | None) -> str:
    if path is None or Path(path).exists():
        return ""
    return f"{key}={path} does not exist"
