"""A parallel ``specdec run`` job: start or join the ranks, then run TP or ADP on each rank.

``run_parallel_job`` is what ``engine.runner.run_job`` hands a ``tp > 1`` or ``dp > 1`` run to:
- under torchrun (``RANK``/``WORLD_SIZE``/``MASTER_*`` already set) this process is one rank;
- otherwise it spawns the ranks on this machine (``launch.spawn_ranks``), waits for them, and
  returns the results rank 0 wrote.

Tensor parallelism (``tp = N``): every rank loads the target, keeps its shard, builds the same
requests (same seeds, so every generator draws the same numbers in the same order) and runs the
same engine; the gathered logits are bitwise identical on every rank, so every rank takes the same
draft and accept/reject decisions. A digest of the outputs is compared across ranks at the end
(a divergence is an error). Only rank 0 writes ``results.json`` / ``outputs.jsonl``.

Attention data parallelism (``dp = N``): every rank tokenises the whole workload identically and
keeps the requests ``rank, rank + N, ...`` (round-robin by index); it runs its own engine with no
cross-rank collective, then posts its share to the store. A rank with no requests posts an empty
share and is done. Rank 0 merges the shares (``merge``) and writes the files; every rank returns
the merged results (under torchrun every rank prints the same summary).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import time
from pathlib import Path
from typing import Any

import torch

from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.schema import RunConfig
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.engine.metrics import SpecStats
from specdec_cli.engine.request import Request
from specdec_cli.engine.runner import DTYPES, build_engine, generate_outputs, output_row
from specdec_cli.engine.workload import build_requests
from specdec_cli.errors import ConfigError
from specdec_cli.models import Transformer, load_model
from specdec_cli.parallel.context import RankContext, distributed, launched_as_rank
from specdec_cli.parallel.drafters import shard_target_and_build_drafter
from specdec_cli.parallel.launch import spawn_ranks
from specdec_cli.parallel.merge import RankShare, merge_rows, merge_stats
from specdec_cli.files import atomic_write_json, atomic_write_jsonl


def run_parallel_job(cfg: RunConfig, effective: EffectiveConfig, output_dir: Path, *,
                     show_progress: bool = True) -> dict:
    """Run a ``tp > 1`` or ``dp > 1`` job (see the module docstring); returns the merged results."""
    if launched_as_rank():
        with distributed(effective.device) as ctx:
            return run_rank_job(ctx, cfg, effective, output_dir, show_progress)
    world_size = cfg.parallelism.tp * cfg.parallelism.dp
    spawn_ranks(run_rank_job, (cfg, effective, output_dir, show_progress),
                world_size=world_size, device_kind=effective.device)
    return json.loads((output_dir / "results.json").read_text())


def run_rank_job(ctx: RankContext, cfg: RunConfig, effective: EffectiveConfig, output_dir: Path,
                 show_progress: bool = False) -> dict:
    """This rank's part of the job; rank 0 writes the result files. Returns the run's results."""
    tp, dp = cfg.parallelism.tp, cfg.parallelism.dp
    if ctx.world_size != tp * dp:
        raise ConfigError([f"{ctx.world_size} ranks were launched but parallelism.tp={tp} x "
                           f"parallelism.dp={dp} needs {tp * dp}"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ctx.local_world_size))
    torch.manual_seed(cfg.sampler.seed)
    show = show_progress and ctx.rank == 0
    if tp > 1:
        return _tensor_parallel(ctx, cfg, effective, output_dir, show)
    return _attention_dp(ctx, cfg, effective, output_dir, show)


# ---------------------------------------------------------------------------- tensor parallelism
def _tensor_parallel(ctx: RankContext, cfg: RunConfig, effective: EffectiveConfig, output_dir: Path,
                     show_progress: bool) -> dict:
    if ctx.device.type == "cuda" and torch.cuda.device_count() < ctx.local_world_size:
        raise ConfigError([f"tensor parallelism over {ctx.local_world_size} local ranks needs as many GPUs "
                           f"(NCCL cannot put two ranks on one GPU); this machine has {torch.cuda.device_count()}"])
    load_start = time.perf_counter()
    target, tokenizer = load_model(cfg.model.path, dtype=DTYPES[cfg.model.dtype], device=ctx.device)
    drafter = shard_target_and_build_drafter(cfg.method, _deps(cfg, target, ctx), ctx.comm)
    requests = build_requests(cfg.workload, cfg.sampler, tokenizer, chat=cfg.model.chat_template)
    engine = build_engine(cfg, effective, target, drafter, tokenizer)
    load_s = time.perf_counter() - load_start
    generate_outputs(engine, requests, tokenizer, show_progress=show_progress)
    _check_ranks_agree(ctx, requests)
    results = _results(cfg, effective, engine.stats, len(requests), load_s, _parallel_info(ctx, "tensor_parallel"))
    if ctx.rank == 0:
        _write(output_dir, [output_row(r) for r in requests], results)
    return results


def _check_ranks_agree(ctx: RankContext, requests: list[Request]) -> None:
    """Every rank must have produced the same tokens (else a decision diverged somewhere)."""
    digest = hashlib.sha256(json.dumps([r.output_token_ids for r in requests]).encode()).hexdigest()
    digests = ctx.comm.all_gather_object(digest)
    if len(set(digests)) != 1:
        raise RuntimeError(f"tensor-parallel ranks diverged: their outputs differ (digests {digests})")


# ---------------------------------------------------------------------------- attention data parallelism
def _attention_dp(ctx: RankContext, cfg: RunConfig, effective: EffectiveConfig, output_dir: Path,
                  show_progress: bool) -> dict:
    tag = ctx.next_tag()
    load_start = time.perf_counter()
    target, tokenizer = load_model(cfg.model.path, dtype=DTYPES[cfg.model.dtype], device=ctx.device)
    requests = build_requests(cfg.workload, cfg.sampler, tokenizer, chat=cfg.model.chat_template)
    indices = list(range(ctx.rank, len(requests), ctx.world_size))
    mine = [requests[i] for i in indices]
    stats = SpecStats()
    if mine:  # a rank without requests posts an empty share and is done
        drafter = build_drafter(cfg.method, _deps(cfg, target, ctx))
        engine = build_engine(cfg, effective, target, drafter, tokenizer)
        load_s = time.perf_counter() - load_start
        generate_outputs(engine, mine, tokenizer, show_progress=show_progress)
        stats = engine.stats
    else:
        load_s = time.perf_counter() - load_start
    share = RankShare(ctx.rank, indices, [output_row(r) for r in mine], stats, load_s)
    ctx.store.set(f"{tag}/share/{ctx.rank}", pickle.dumps(share))
    if ctx.rank == 0:
        results = _merge_shares(ctx, tag, cfg, effective, len(requests), output_dir)
        ctx.store.set(f"{tag}/results", json.dumps(results, default=str))
        return results
    ctx.wait_keys([f"{tag}/results"])
    return json.loads(ctx.store.get(f"{tag}/results"))


def _merge_shares(ctx: RankContext, tag: str, cfg: RunConfig, effective: EffectiveConfig, num_requests: int,
                  output_dir: Path) -> dict:
    keys = [f"{tag}/share/{rank}" for rank in range(ctx.world_size)]
    ctx.wait_keys(keys)
    shares: list[RankShare] = [pickle.loads(ctx.store.get(key)) for key in keys]
    rows = merge_rows(shares, num_requests)
    stats = merge_stats([share.stats for share in shares])
    info = _parallel_info(ctx, "attention_dp")
    info["requests_per_rank"] = [len(share.indices) for share in shares]
    results = _results(cfg, effective, stats, num_requests, max(s.load_s for s in shares), info)
    _write(output_dir, rows, results)
    return results


# ---------------------------------------------------------------------------- shared steps
def _deps(cfg: RunConfig, target: Transformer, ctx: RankContext) -> DrafterDeps:
    return DrafterDeps(target=target, num_slots=cfg.engine.max_batch_size, max_seq_len=cfg.engine.max_seq_len,
                       vocab_size=target.arch.vocab_size, device=ctx.device, dtype=DTYPES[cfg.model.dtype])


def _parallel_info(ctx: RankContext, mode: str) -> dict[str, Any]:
    backend = "nccl" if ctx.device.type == "cuda" else "gloo"
    return {"mode": mode, "world_size": ctx.world_size, "backend": backend,
            "collectives": dict(sorted(ctx.comm.counts.items()))}


def _results(cfg: RunConfig, effective: EffectiveConfig, stats: SpecStats, num_requests: int, load_s: float,
             parallel: dict[str, Any]) -> dict:
    return {
        "config": dataclasses.asdict(cfg),
        "effective": effective.to_dict(),
        "metrics": {**stats.summary(), "load_s": load_s, "num_requests": num_requests},
        "parallel": parallel,
    }


def _write(output_dir: Path, rows: list[dict], results: dict) -> None:
    atomic_write_jsonl(output_dir / "outputs.jsonl", rows)
    atomic_write_json(output_dir / "results.json", results)
