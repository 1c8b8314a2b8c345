"""Turn run results into report rows: labels, effective acceptance, speed-up vs the baseline.

Speed-up is ``tokens_per_s / tokens_per_s(baseline)``, where the baseline is the
``method=none`` run (the mean, if there are several) of the same sweep (the same parent
directory) with the same sampler parameters (temperature, top-k, top-p), workload, model,
engine settings and device. Without such a baseline the speed-up is blank (``None``).
"""
from __future__ import annotations

import dataclasses
import functools
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import PurePosixPath
from statistics import fmean
from typing import Any, Optional

from specdec_cli.config.matrix import METHODS, MODEL_BASED
from specdec_cli.report.collect import RunRecord, natural_key

BASELINE_METHOD = "none"
#: method knobs that make a variant, and their short names: a label shows ``short=value`` where a run's value
#: differs from its method's default (``method=<name>`` as conf/method/<name>.yaml composes it)
VARIANT_KNOBS = {"draft_confidence": "conf", "suffix_enhancer": "sfx", "suffix_min_match": "min_match",
                 "adaptive_min_accept": "skip", "max_total_draft_tokens": "nodes"}


@dataclass(frozen=True)
class ReportRow:
    """One finished run, ready for a table or a plot."""

    run: str  # directory relative to the report root
    method: str  # label, e.g. "draft_target(self=4)"
    method_name: str  # config name, e.g. "draft_target"
    sampler: str  # label, e.g. "topk(T=1,k=20)"
    workload: str
    k: int  # method.num_draft_tokens
    rejection: str  # "on" | "off" | "on (greedy)" | "relaxed (lossy)"
    acceptance_length: Optional[float]
    acceptance_rate: Optional[float]
    tokens_per_s: Optional[float]
    per_position: tuple[float, ...]
    baseline_key: str  # runs with equal keys are compared with each other
    speedup: Optional[float] = None
    per_category: tuple[tuple[str, dict[str, Any]], ...] = ()  # (category, metrics) of MT-Bench / Spec-Bench runs
    latency_s: tuple[tuple[str, Optional[float]], ...] = ()  # ("ttft_p50", s), ... for LATENCY x PERCENTILES
    accepted_per_step: tuple[int, ...] = ()  # [i]: verify steps that accepted i drafts
    ms_per_token: tuple[tuple[str, float], ...] = ()  # (phase, ms per generated token) of metrics.time_breakdown_s


def build_rows(runs: tuple[RunRecord, ...] | list[RunRecord]) -> list[ReportRow]:
    """Rows for every run, with speed-ups filled in, sorted by sweep, method, sampler and K."""
    rows = [row_from_results(run.run, run.results) for run in runs]
    return sorted(with_speedups(rows), key=_sort_key)


def row_from_results(run: str, results: dict[str, Any]) -> ReportRow:
    """One row from one ``results.json`` (missing fields become blanks, never errors)."""
    config, metrics = results.get("config", {}), results.get("metrics", {})
    effective = results.get("effective", {})
    method, sampler = config.get("method", {}), config.get("sampler", {})
    return ReportRow(
        run=run,
        method=method_label(method, effective),
        method_name=str(method.get("name", "?")),
        sampler=sampler_label(sampler),
        workload=str(config.get("workload", {}).get("name", "?")),
        k=int(method.get("num_draft_tokens", 0) or 0),
        rejection=rejection_label(effective),
        acceptance_length=_number(metrics.get("acceptance_length")),
        acceptance_rate=_number(metrics.get("acceptance_rate")),
        tokens_per_s=_number(metrics.get("tokens_per_s")),
        per_position=tuple(float(x) for x in metrics.get("per_position_acceptance") or ()),
        baseline_key=baseline_key(run, config, effective),
        per_category=tuple(sorted((metrics.get("per_category") or {}).items())),
        latency_s=latency_cells(metrics),
        accepted_per_step=tuple(int(n) for n in metrics.get("accepted_per_step") or ()),
        ms_per_token=ms_per_token(metrics),
    )


def ms_per_token(metrics: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    """(phase, milliseconds per generated token) of ``time_breakdown_s``; () without tokens or a breakdown."""
    breakdown, tokens = metrics.get("time_breakdown_s") or {}, _number(metrics.get("generated_tokens"))
    if not tokens or not isinstance(breakdown, dict):
        return ()
    cells = tuple((str(phase), 1000 * value / tokens) for phase, seconds in breakdown.items()
                  if (value := _number(seconds)) is not None)
    return cells if len(cells) == len(breakdown) else ()


LATENCY = ("ttft", "tpot", "itl")  # metrics.<name>_s = {mean, p50, p95, p99}
PERCENTILES = ("p50", "p95")


def latency_cells(metrics: dict[str, Any]) -> tuple[tuple[str, Optional[float]], ...]:
    """(``ttft_p50``, seconds), ... from results.json's latency metrics (None where a run has none)."""
    return tuple((f"{name}_{q}", _number((metrics.get(f"{name}_s") or {}).get(q)))
                 for name in LATENCY for q in PERCENTILES)


def method_label(method: dict[str, Any], effective: Optional[dict[str, Any]] = None) -> str:
    """The method name plus what distinguishes variants of it (self-speculation, draft, policy, a draft tree's
    children per node: ``method.tree_topk``, or where it is auto the run's resolved ``effective.tree_topk``;
    the ``VARIANT_KNOBS`` that differ from the method's default, e.g. ``eagle3(tree=2,conf=0.5,sfx=off)``)."""
    name = str(method.get("name", "?"))
    details = []
    tree_topk = method.get("tree_topk")
    tree_topk = (effective or {}).get("tree_topk", 1) if tree_topk is None else tree_topk
    if isinstance(tree_topk, int) and tree_topk > 1:
        details.append(f"tree={tree_topk}")
    if method.get("self_speculative_layers") is not None:
        details.append(f"self={method['self_speculative_layers']}")
    if method.get("draft_path"):
        details.append(PurePosixPath(str(method["draft_path"])).stem)
    if method.get("draft_policy", "sample") != "sample" and name in MODEL_BASED:
        details.append(str(method["draft_policy"]))
    if method.get("draft_len_schedule"):
        details.append("dynK")
    defaults = method_defaults(name)
    for knob, short in VARIANT_KNOBS.items():
        if knob in method and knob in defaults and method[knob] != defaults[knob]:
            details.append(f"{short}={_knob_value(method[knob])}")
    return f"{name}({','.join(details)})" if details else name


@functools.lru_cache(maxsize=None)
def method_defaults(name: str) -> dict[str, Any]:
    """The settings ``method=<name>`` composes to ({} for a name this package does not know)."""
    from specdec_cli.config.compose import compose_config  # Hydra: only when a label needs it
    from specdec_cli.errors import ConfigError

    if name not in METHODS:
        return {}
    try:
        return dataclasses.asdict(compose_config([f"method={name}"]).method)
    except ConfigError:
        return {}


def _knob_value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "on", False: "off", None: "auto"}[value]
    return f"{value:g}" if isinstance(value, float) else str(value)


def sampler_label(sampler: dict[str, Any]) -> str:
    """``greedy``, ``temperature(T=0.7)``, ``topk(T=1,k=20)``: the name and its active filters."""
    name = str(sampler.get("name", "?"))
    temperature = float(sampler.get("temperature", 0.0))
    top_k, top_p = int(sampler.get("top_k", 0)), float(sampler.get("top_p", 1.0))
    if temperature == 0:
        return name if name == "greedy" else f"{name}(T=0)"
    params = [f"T={temperature:g}"]
    if top_k > 0:
        params.append(f"k={top_k}")
    if top_p < 1:
        params.append(f"p={top_p:g}")
    return f"{name}({','.join(params)})"


def rejection_label(effective: dict[str, Any]) -> str:
    """The acceptance rule the run used; "on (greedy)": enabled, but every request was greedy,
    so the argmax fast path ran and rejection sampling never did."""
    if effective.get("relaxed_acceptance"):
        return "relaxed (lossy)"
    if not effective.get("rejection"):
        return "off"
    return "on (greedy)" if effective.get("all_greedy") else "on"


def baseline_key(run: str, config: dict[str, Any], effective: dict[str, Any]) -> str:
    """What must be equal for two runs to be compared: sweep, sampler, workload, model, engine."""
    sampler = config.get("sampler", {})
    key = {
        "sweep": PurePosixPath(run).parent.as_posix(),
        "sampler": [sampler.get("temperature"), sampler.get("top_k"), sampler.get("top_p")],
        "workload": config.get("workload"),
        "model": config.get("model"),
        "engine": config.get("engine"),
        "device": effective.get("device"),
    }
    return json.dumps(key, sort_keys=True, default=str)


def with_speedups(rows: list[ReportRow]) -> list[ReportRow]:
    """Fill ``speedup`` from the mean tokens/s of the baseline runs with the same key."""
    baselines: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if row.method_name == BASELINE_METHOD and row.tokens_per_s:
            baselines[row.baseline_key].append(row.tokens_per_s)
    out = []
    for row in rows:
        reference = baselines.get(row.baseline_key)
        speedup = row.tokens_per_s / fmean(reference) if reference and row.tokens_per_s is not None else None
        out.append(dataclasses.replace(row, speedup=speedup))
    return out


def _sort_key(row: ReportRow) -> tuple:
    method_rank = METHODS.index(row.method_name) if row.method_name in METHODS else len(METHODS)
    sweep = PurePosixPath(row.run).parent.as_posix()
    return (natural_key(sweep), method_rank, row.method, row.sampler, row.k, natural_key(row.run))


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
