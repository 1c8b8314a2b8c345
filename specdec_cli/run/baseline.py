"""``baseline=true``: the job's requests once more through a drafter-less engine (method=none).

Same target (no second model load), same engine settings, same per-request seeds; it runs after the
speculative run, so warm-up costs (first allocations, lazy kernels) fall on the speculative side. Adds
to results.json's metrics:
- ``baseline``: the autoregressive run's tokens_per_s, wall_s, generated_tokens, target_forwards, ttft_s, tpot_s;
- ``speedup``: speculative tokens/s over autoregressive tokens/s;
- ``baseline_identical`` (all-greedy runs only): every request's output tokens equal the autoregressive
  ones, a losslessness check the job gets for free.
"""
from __future__ import annotations

from typing import Any

from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.schema import RunConfig
from specdec_cli.engine.engine import SpecEngine
from specdec_cli.engine.request import Request
from specdec_cli.run.drive import generate_outputs
from specdec_cli.run.pipeline import Pipeline, engine_options

BASELINE_KEYS = ("tokens_per_s", "wall_s", "generated_tokens", "target_forwards", "ttft_s", "tpot_s")


def fresh_copy(request: Request) -> Request:
    """``request`` as it was before any engine ran it (same prompt, sampling, seed, limits)."""
    return Request(id=request.id, prompt_token_ids=list(request.prompt_token_ids), params=request.params,
                   max_new_tokens=request.max_new_tokens, prompt=request.prompt, stop=request.stop,
                   eos_token_ids=request.eos_token_ids)


def run_baseline(cfg: RunConfig, effective: EffectiveConfig, pipeline: Pipeline, originals: list[Request],
                 speculative: list[Request], *, show_progress: bool) -> dict[str, Any]:
    """Run ``originals`` (fresh requests) autoregressively; the metrics to add (module docstring).
    ``speculative``: the same requests after the speculative run, in the same order."""
    engine = SpecEngine(pipeline.target, None, engine_options(cfg, effective), decode=pipeline.engine.decode)
    generate_outputs(engine, originals, pipeline.tokenizer, show_progress=show_progress)
    stats = engine.stats.summary()
    baseline_rate = stats["tokens_per_s"]
    record: dict[str, Any] = {
        "baseline": {key: stats[key] for key in BASELINE_KEYS},
        "speedup": pipeline.engine.stats.summary()["tokens_per_s"] / baseline_rate if baseline_rate else 0.0,
    }
    if effective.all_greedy:
        record["baseline_identical"] = all(
            a.output_token_ids == b.output_token_ids for a, b in zip(speculative, originals, strict=True))
    return record
