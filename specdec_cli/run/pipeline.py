"""``specdec run``'s job: build the pipeline from the typed config, run it, write results.

  1. load the target model and tokenizer       (models/)
  2. build the drafter from the registry        (drafters/)
  3. tokenise the workload into requests        (engine/workload.py)
  4. run the engine until every request is done (engine/engine.py)
  5. write results.json + outputs.jsonl atomically and return the results
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specdec_cli.config.schema import RunConfig
from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request
from specdec_cli.engine.workload import build_requests
from specdec_cli.errors import ConfigError
from specdec_cli.models import load_model
from specdec_cli.files import atomic_write_json, atomic_write_jsonl

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def run_requests(engine: SpecEngine, requests: list[Request], *, show_progress: bool = False) -> list[Request]:
    """Feed ``requests`` through ``engine`` until all finish; returns them in input order."""
    for request in requests:
        engine.add_request(request)
    start = time.perf_counter()
    with Progress(TextColumn("[bold]generating"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                  TimeElapsedColumn(), transient=True, disable=not show_progress) as progress:
        task = progress.add_task("run", total=len(requests))
        while engine.has_work():
            progress.advance(task, len(engine.step()))
    engine.stats.wall_s += time.perf_counter() - start
    return requests


def build_engine(cfg: RunConfig, effective: EffectiveConfig, target, drafter, tokenizer) -> SpecEngine:
    """The engine a job runs: the config's engine, method and effective acceptance settings."""
    return SpecEngine(target, drafter, EngineOptions(
        max_batch_size=cfg.engine.max_batch_size, max_seq_len=cfg.engine.max_seq_len,
        prefill_chunk=cfg.engine.prefill_chunk, max_draft_len=cfg.method.num_draft_tokens,
        draft_len_schedule=effective.draft_len_schedule, rejection=effective.rejection,
        backend=effective.backend,
        relaxed=(cfg.method.relaxed_topk, cfg.method.relaxed_delta) if effective.relaxed_acceptance else None,
    ), decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True))


def generate_outputs(engine: SpecEngine, requests: list[Request], tokenizer, *, show_progress: bool) -> None:
    """Run ``requests`` to completion and decode their text; unfit requests are input errors."""
    try:
        run_requests(engine, requests, show_progress=show_progress)
    except ValueError as err:  # a request that cannot fit, an empty prompt
        raise ConfigError([str(err)]) from None
    for request in requests:
        if not request.output_text:
            request.output_text = tokenizer.decode(request.output_token_ids, skip_special_tokens=True)


def run_job(cfg: RunConfig, effective: EffectiveConfig, output_dir: Path, *,
            show_progress: bool = True) -> dict:
    # Parallel runs (tensor / attention data parallelism) launch or join their own ranks; each
    # rank builds its pipeline in specdec_cli/parallel/job.py (imported here: torch.distributed
    # and the launcher load only for parallel runs).
    if cfg.parallelism.tp > 1 or cfg.parallelism.dp > 1:
        from specdec_cli.parallel.job import run_parallel_job

        return run_parallel_job(cfg, effective, output_dir, show_progress=show_progress)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    torch.manual_seed(cfg.sampler.seed)
    load_start = time.perf_counter()
    target, tokenizer = load_model(cfg.model.path, dtype=DTYPES[cfg.model.dtype], device=effective.device)
    drafter = build_drafter(cfg.method, DrafterDeps(
        target=target, num_slots=cfg.engine.max_batch_size, max_seq_len=cfg.engine.max_seq_len,
        vocab_size=target.arch.vocab_size, device=torch.device(effective.device), dtype=DTYPES[cfg.model.dtype],
    ))
    requests = build_requests(cfg.workload, cfg.sampler, tokenizer, chat=cfg.model.chat_template)
    engine = build_engine(cfg, effective, target, drafter, tokenizer)
    load_s = time.perf_counter() - load_start
    generate_outputs(engine, requests, tokenizer, show_progress=show_progress)
    results = {
        "config": asdict(cfg),
        "effective": effective.to_dict(),
        "metrics": {**engine.stats.summary(), "load_s": load_s, "num_requests": len(requests)},
    }
    atomic_write_jsonl(output_dir / "outputs.jsonl", (output_row(r) for r in requests))
    atomic_write_json(output_dir / "results.json", results)
    return results


def output_row(request: Request) -> dict:
    """One line of outputs.jsonl."""
    return {
        "id": request.id, "prompt": request.prompt, "prompt_token_ids": request.prompt_token_ids,
        "output_token_ids": request.output_token_ids, "output_text": request.output_text,
        "steps": request.steps, "finish_reason": request.finish_reason,
    }
