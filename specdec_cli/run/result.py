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


def category_metrics(requests: list[Request]) -> dict[str, Any]:
    """``{"per_category": {category: {num_requests, generated_tokens, acceptance_length, tokens_per_s}}}`` over
    the requests whose workload names a category (MT-Bench, Spec-Bench); ``{}`` when none does.

    ``tokens_per_s``: the category's output tokens over its requests' summed arrival-to-finish time (with
    engine.max_batch_size=1 requests run one at a time, so the times add up to the run's generation time)."""
    groups: dict[str, list[Request]] = {}
    for request in requests:
        if request.category is not None:
            groups.setdefault(request.category, []).append(request)
    per_category = {}
    for category, members in sorted(groups.items()):
        steps = sum(r.steps for r in members)
        tokens = sum(len(r.output_token_ids) for r in members)
        seconds = sum(r.finish_s - r.arrival_s for r in members)
        per_category[category] = {
            "num_requests": len(members), "generated_tokens": tokens,
            "acceptance_length": sum(r.emitted_tokens for r in members) / steps if steps else 0.0,
            "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
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
