"""One rank's view of a parallel run: torchrun-compatible environment, process group, store.

A rank is described by the variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); ``specdec run`` sets the same ones on
the processes it spawns, so both launch modes take the same path from here on.

Backends: gloo on CPU; on CUDA ``cpu:gloo,cuda:nccl`` (NCCL for tensors, gloo for the small
object exchanges). Every collective times out after ``SPECDEC_COLLECTIVE_TIMEOUT_S`` seconds
(default 60), so a rank whose peer died or hangs fails with an error instead of waiting forever.
The key-value store (created here, so this module can use it) carries ADP results to rank 0.
"""
from __future__ import annotations

import contextlib
import datetime
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.distributed as dist

from specdec_cli.errors import ConfigError
from specdec_cli.parallel.comm import Comm

RANK_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT_ENV = "SPECDEC_COLLECTIVE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0
POLL_S = 0.05


def launched_as_rank() -> bool:
    """Whether this process is already one rank of a launched group (torchrun, or spawned by us)."""
    return all(name in os.environ for name in RANK_ENV)


def collective_timeout() -> datetime.timedelta:
    """The timeout of every collective and store operation (``$SPECDEC_COLLECTIVE_TIMEOUT_S``, default 60 s)."""
    raw = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise ConfigError([f"{TIMEOUT_ENV}={raw} must be a positive number of seconds"])
    return datetime.timedelta(seconds=seconds)


@dataclass
class RankContext:
    """This rank's coordinates, device, collectives (``comm``) and the group's key-value store."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    comm: Comm
    store: dist.Store
    _tags: Iterator[int] = field(default_factory=itertools.count)

    def next_tag(self) -> str:
        """A store namespace for the next exchange (every rank calls this in the same order)."""
        return f"exchange{next(self._tags)}"

    def wait_keys(self, keys: list[str]) -> None:
        """Block until every key is in the store (no deadline: a dead rank ends the run instead)."""
        while not self.store.check(keys):
            time.sleep(POLL_S)


@contextlib.contextmanager
def distributed(device_kind: str) -> Iterator[RankContext]:
    """Join the group described by the environment; leave it (and destroy it) on exit.

    ``device_kind``: "cpu" or "cuda" (the rank uses GPU ``LOCAL_RANK`` modulo the GPU count).
    """
    env = os.environ
    rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank = int(env.get("LOCAL_RANK", rank))
    local_world_size = int(env.get("LOCAL_WORLD_SIZE", world_size))
    timeout = collective_timeout()
    device = _rank_device(device_kind, local_rank)
    # under torchrun's agent store the agent hosts the store; otherwise rank 0 does
    hosts_store = rank == 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world_size, hosts_store, timeout=timeout)
    # a fresh namespace per job (a Hydra sweep under torchrun runs several jobs on one store): every
    # rank counts itself in, and no rank can start the next job before all ranks joined this one
    job = (int(store.add("specdec/joined", 1)) - 1) // world_size
    store = dist.PrefixStore(f"specdec/job{job}", store)
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=world_size,
                            timeout=timeout)
    ctx = RankContext(rank, world_size, local_rank, local_world_size, device, Comm(rank, world_size), store)
    try:
        yield ctx
        _leave(ctx)
    finally:
        dist.destroy_process_group()


def _rank_device(kind: str, local_rank: int) -> torch.device:
    if kind != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def _leave(ctx: RankContext) -> None:
    """Rank 0 may host the store: it leaves last, once every rank has said it is done with it."""
    ctx.store.add("left", 1)
    deadline = time.monotonic() + collective_timeout().total_seconds()
    while ctx.rank == 0 and int(ctx.store.add("left", 0)) < ctx.world_size and time.monotonic() < deadline:
        time.sleep(POLL_S)
