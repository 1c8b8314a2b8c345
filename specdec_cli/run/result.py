"""What a finished job returns: ``RunResult``, whose ``to_dict`` is results.json."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.schema import RunConfig
from specdec_cli.engine.metrics import SpecStats
from specdec_cli.engine.request import Request


@dataclass
class RunResult:
    """A finished run: its settings, its metrics and one outputs.jsonl row per request (workload order)."""

    config: RunConfig
    effective: EffectiveConfig
    metrics: dict[str, Any]  # SpecStats.summary() + load_s + num_requests
    requests: list[dict[str, Any]]  # output_row of each request
    parallel: Optional[dict[str, Any]] = None  # how the ranks ran (tp > 1 or dp > 1 only)

    def to_dict(self) -> dict[str, Any]:
        """The results.json record: config, effective, metrics (and parallel)."""
        record = {"config": dataclasses.asdict(self.config), "effective": self.effective.to_dict(),
                  "metrics": self.metrics}
        if self.parallel is not None:
            record["parallel"] = self.parallel
        return record


def run_metrics(stats: SpecStats, load_s: float, num_requests: int) -> dict[str, Any]:
    """The metrics of results.json: the engine's summary, the load time and the request count."""
    return {**stats.summary(), "load_s": load_s, "num_requests": num_requests}


CategoryTally = dict[str, list[float]]  # category -> [requests, generated tokens, verify steps, emitted, seconds]


def category_tally(requests: list[Request]) -> CategoryTally:
    """The sums ``category_metrics`` needs, per category; tallies of several ranks add up (``merge_tallies``)."""
    tally: CategoryTally = {}
    for r in requests:
        if r.category is not None:
            cell = tally.setdefault(r.category, [0, 0, 0, 0, 0.0])
            for i, value in enumerate((1, len(r.output_token_ids), r.steps, r.emitted_tokens, r.finish_s - r.arrival_s)):
                cell[i] += value
    return tally


def merge_tallies(tallies: list[CategoryTally]) -> CategoryTally:
    merged: CategoryTally = {}
    for tally in tallies:
        for category, cell in tally.items():
            merged[category] = [a + b for a, b in zip(merged.get(category, [0] * len(cell)), cell)]
    return merged


def category_metrics(tally: CategoryTally) -> dict[str, Any]:
    """``{"per_category": {category: {num_requests, generated_tokens, acceptance_length, tokens_per_s}}}`` over
    the requests of ``tally`` (``category_tally``), whose workload names a category (MT-Bench, Spec-Bench);
    ``{}`` when none does.

    ``tokens_per_s``: the category's output tokens over its requests' summed arrival-to-finish time (with
    engine.max_batch_size=1 requests run one at a time, so the times add up to the run's generation time)."""
    per_category = {
        category: {"num_requests": int(count), "generated_tokens": int(tokens),
                   "acceptance_length": emitted / steps if steps else 0.0,
                   "tokens_per_s": tokens / seconds if seconds > 0 else 0.0}
        for category, (count, tokens, steps, emitted, seconds) in sorted(tally.items())
    }
    return {"per_category": per_category} if per_category else {}


def output_row(request: Request) -> dict[str, Any]:
    """One line of outputs.jsonl."""
    return {
        "id": request.id, "prompt": request.prompt, "prompt_token_ids": request.prompt_token_ids,
        "output_token_ids": request.output_token_ids, "output_text": request.output_text,
        "steps": request.steps, "finish_reason": request.finish_reason,
        "acceptance_length": request.acceptance_length, "ttft_s": request.ttft_s, "tpot_s": request.tpot_s,
        **({"error": request.error} if request.error is not None else {}),
    }
