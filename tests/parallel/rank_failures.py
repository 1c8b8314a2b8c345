"""A rank function that fails on purpose (importable by the spawned ranks; imports little, so
the ranks start fast)."""
from __future__ import annotations

import os
import signal
import time

import torch

from specdec_cli.parallel.context import RankContext


def fail_on_rank_1(ctx: RankContext, how: str) -> None:
    """Rank 1 raises / is killed / hangs while rank 0 waits in a collective."""
    if ctx.rank == 1:
        if how == "raise":
            raise ValueError("boom on purpose")
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)  # "hang": rank 0's collective times out
    ctx.comm.all_reduce_sum(torch.ones(4))
