"""``specdec run``'s job: lock the output directory, build the pipeline, run it, write the results."""
from __future__ import annotations

import time
from pathlib import Path

from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.schema import RunConfig
from specdec_cli.run.baseline import fresh_copy, run_baseline
from specdec_cli.run.drive import generate_outputs
from specdec_cli.run.outputs import locked_output_dir, write_results
from specdec_cli.run.pipeline import build_pipeline
from specdec_cli.run.profile import profiled
from specdec_cli.run.result import RunResult, category_metrics, category_tally, output_row, run_metrics


def run_job(cfg: RunConfig, effective: EffectiveConfig, output_dir: Path, *,
            show_progress: bool = True) -> RunResult:
    """Run the job ``cfg`` describes and write results.json + outputs.jsonl to ``output_dir``."""
    if cfg.parallelism.tp > 1 or cfg.parallelism.dp > 1:
        # torch.distributed and the launcher load only for parallel runs
        from specdec_cli.run.ranks import run_parallel_job

        return run_parallel_job(cfg, effective, output_dir, show_progress=show_progress)
    with locked_output_dir(output_dir):
        load_start = time.perf_counter()
        pipeline = build_pipeline(cfg, effective)
        load_s = time.perf_counter() - load_start
        requests = pipeline.requests
        originals = [fresh_copy(request) for request in requests] if cfg.baseline else []
        with profiled(pipeline.engine, output_dir, cfg.profile) as profile:
            generate_outputs(pipeline.engine, requests, pipeline.tokenizer, show_progress=show_progress)
        metrics = {**run_metrics(pipeline.engine.stats, load_s, len(requests)), **category_metrics(category_tally(requests))}
        if profile:
            metrics["profile"] = profile
        if cfg.baseline:
            metrics.update(run_baseline(cfg, effective, pipeline, originals, requests, show_progress=show_progress))
        result = RunResult(cfg, effective, metrics, [output_row(request) for request in requests])
        write_results(output_dir, result)
    return result
