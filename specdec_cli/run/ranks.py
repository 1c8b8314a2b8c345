"""A parallel ``specdec run`` job: start or join the ranks, then run TP or ADP on each rank.

``run_parallel_job`` is what ``run_job`` hands a ``tp > 1`` or ``dp > 1`` run to:
- under torchrun (``RANK``/``WORLD_SIZE``/``MASTER_*`` already set) this process is one rank;
  rank 0 locks the output directory;
- otherwise it locks the output directory, spawns the ranks on this machine
  (``parallel.launch.spawn_ranks``), waits for them, and returns the results rank 0 wrote.

Every rank builds its pipeline with ``build_pipeline`` (the same build as a single process).

Tensor parallelism (``tp = N``): every rank loads the target, keeps its shard, builds the same
requests (same seeds, so every generator draws the same numbers in the same order) and runs the
same engine; the gathered logits are bitwise identical on every rank, so every rank takes the same
draft and accept/reject decisions. A digest of the outputs is compared across ranks at the end
(a divergence is an error). Only rank 0 writes ``results.json`` / ``outputs.jsonl``.

Attention data parallelism (``dp = N``): every rank tokenises the whole workload identically and
keeps the requests ``rank, rank + N, ...`` (round-robin by index); it runs its own engine with no
cross-rank collective, then posts its share to the store. A rank with no requests posts an empty
share and is done. Rank 0 merges the shares (``parallel.merge``) and writes the files; every rank
returns the merged result (under torchrun every rank prints the same summary).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import pickle
import time
from pathlib import Path
from typing import Any

import torch

from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.schema import RunConfig
from specdec_cli.engine.metrics import SpecStats
from specdec_cli.engine.request import Request
from specdec_cli.errors import ConfigError
from specdec_cli.parallel.context import RankContext, distributed, launched_as_rank
from specdec_cli.parallel.launch import spawn_ranks
from specdec_cli.parallel.merge import RankShare, merge_rows, merge_stats
from specdec_cli.run.drive import generate_outputs
from specdec_cli.run.outputs import locked_output_dir, read_results, write_results
from specdec_cli.run.pipeline import build_pipeline
from specdec_cli.run.result import (
    RunResult, category_metrics, category_tally, merge_tallies, output_row, run_metrics,
)


def run_parallel_job(cfg: RunConfig, effective: EffectiveConfig, output_dir: Path, *,
                     show_progress: bool = True) -> RunResult:
    """Run a ``tp > 1`` or ``dp > 1`` job (see the module docstring); returns the merged result."""
    if launched_as_rank():
        with distributed(effective.device) as ctx:
            lock = locked_output_dir(output_dir) if ctx.rank == 0 else contextlib.nullcontext()
            with lock:
                return run_rank_job(ctx, cfg, effective, output_dir, show_progress)
    world_size = cfg.parallelism.tp * cfg.parallelism.dp
    with locked_output_dir(output_dir):
        spawn_ranks(run_rank_job, (cfg, effective, output_dir, show_progress),
                    world_size=world_size, device_kind=effective.device)
        return read_results(output_dir, cfg, effective)


def run_rank_job(ctx: RankContext, cfg: RunConfig, effective: EffectiveConfig, output_dir: Path,
                 show_progress: bool = False) -> RunResult:
    """This rank's part of the job; rank 0 writes the result files. Returns the run's result."""
    tp, dp = cfg.parallelism.tp, cfg.parallelism.dp
    if ctx.world_size != tp * dp:
        raise ConfigError([f"{ctx.world_size} ranks were launched but parallelism.tp={tp} x "
                           f"parallelism.dp={dp} needs {tp * dp}"])
    show = show_progress and ctx.rank == 0
    if tp > 1:
        return _tensor_parallel(ctx, cfg, effective, output_dir, show)
    return _attention_dp(ctx, cfg, effective, output_dir, show)


# ---------------------------------------------------------------------------- tensor parallelism
def _tensor_parallel(ctx: RankContext, cfg: RunConfig, effective: EffectiveConfig, output_dir: Path,
                     show_progress: bool) -> RunResult:
    if ctx.device.type == "cuda" and torch.cuda.device_count() < ctx.local_world_size:
        raise ConfigError([f"tensor parallelism over {ctx.local_world_size} local ranks needs as many GPUs "
                           f"(NCCL cannot put two ranks on one GPU); this machine has {torch.cuda.device_count()}"])
    load_start = time.perf_counter()
    pipeline = build_pipeline(cfg, effective, rank_ctx=ctx)
    load_s = time.perf_counter() - load_start
    requests = pipeline.requests
    generate_outputs(pipeline.engine, requests, pipeline.tokenizer, show_progress=show_progress)
    _check_ranks_agree(ctx, requests)
    metrics = {**run_metrics(pipeline.engine.stats, load_s, len(requests)),
               **category_metrics(category_tally(requests))}
    result = RunResult(cfg, effective, metrics, [output_row(r) for r in requests], _parallel_info(ctx, "tensor_parallel"))
    if ctx.rank == 0:
        write_results(output_dir, result)
    return result


def _check_ranks_agree(ctx: RankContext, requests: list[Request]) -> None:
    """Every rank must have produced the same tokens (else a decision diverged somewhere)."""
    digest = hashlib.sha256(json.dumps([r.output_token_ids for r in requests]).encode()).hexdigest()
    digests = ctx.comm.all_gather_object(digest)
    if len(set(digests)) != 1:
        raise RuntimeError(f"tensor-parallel ranks diverged: their outputs differ (digests {digests})")


# ---------------------------------------------------------------------------- attention data parallelism
def _attention_dp(ctx: RankContext, cfg: RunConfig, effective: EffectiveConfig, output_dir: Path,
                  show_progress: bool) -> RunResult:
    tag = ctx.next_tag()
    load_start = time.perf_counter()
    pipeline = build_pipeline(cfg, effective, rank_ctx=ctx)
    load_s = time.perf_counter() - load_start
    indices = list(range(ctx.rank, len(pipeline.requests), ctx.world_size))
    mine = [pipeline.requests[i] for i in indices]
    stats = SpecStats()
    if mine:  # a rank without requests posts an empty share and is done
        generate_outputs(pipeline.engine, mine, pipeline.tokenizer, show_progress=show_progress)
        stats = pipeline.engine.stats
    share = RankShare(ctx.rank, indices, [output_row(r) for r in mine], stats, load_s, category_tally(mine))
    ctx.store.set(f"{tag}/share/{ctx.rank}", pickle.dumps(share))
    if ctx.rank == 0:
        result = _merge_shares(ctx, tag, cfg, effective, len(pipeline.requests))
        write_results(output_dir, result)
        ctx.store.set(f"{tag}/result", pickle.dumps(result))
        return result
    ctx.wait_keys([f"{tag}/result"])
    return pickle.loads(ctx.store.get(f"{tag}/result"))


def _merge_shares(ctx: RankContext, tag: str, cfg: RunConfig, effective: EffectiveConfig,
                  num_requests: int) -> RunResult:
    keys = [f"{tag}/share/{rank}" for rank in range(ctx.world_size)]
    ctx.wait_keys(keys)
    shares: list[RankShare] = [pickle.loads(ctx.store.get(key)) for key in keys]
    info = _parallel_info(ctx, "attention_dp")
    info["requests_per_rank"] = [len(share.indices) for share in shares]
    metrics = {**run_metrics(merge_stats([share.stats for share in shares]), max(s.load_s for s in shares),
                             num_requests),
               **category_metrics(merge_tallies([share.categories for share in shares]))}
    return RunResult(cfg, effective, metrics, merge_rows(shares, num_requests), info)


def _parallel_info(ctx: RankContext, mode: str) -> dict[str, Any]:
    backend = "nccl" if ctx.device.type == "cuda" else "gloo"
    return {"mode": mode, "world_size": ctx.world_size, "backend": backend,
            "collectives": dict(sorted(ctx.comm.counts.items()))}
