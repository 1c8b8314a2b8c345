"""Functions the spawned ranks of the parallel tests run (importable by name: the tests put this
directory on the ranks' PYTHONPATH)."""
from __future__ import annotations

from pathlib import Path

from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.schema import RunConfig
from specdec_cli.parallel import shard
from specdec_cli.parallel.context import RankContext
from specdec_cli.run.ranks import run_rank_job

Job = tuple[RunConfig, EffectiveConfig, Path, bool]  # config, effective, output dir, shard every draft
DEFAULT_SHARD_MIN = shard.SHARD_DRAFT_MIN_PARAMS


def run_jobs(ctx: RankContext, jobs: list[Job]) -> None:
    """Several ``run_rank_job`` calls in one group (spawning ranks is the slow part of these tests)."""
    for cfg, effective, output_dir, shard_every_draft in jobs:
        shard.SHARD_DRAFT_MIN_PARAMS = 0 if shard_every_draft else DEFAULT_SHARD_MIN
        ctx.comm.counts.clear()
        run_rank_job(ctx, cfg, effective, output_dir)
