"""Spawn the ranks of a parallel run on this machine and watch them.

``spawn_ranks(fn, args, world_size=N)`` starts N processes of ``python -m
specdec_cli.parallel.worker`` with torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT`` = a free port), hands each one
``(fn, args)`` pickled on its stdin, and polls them. Each rank runs ``fn(ctx, *args)`` inside
``context.distributed``; ``fn`` must be importable by name (a module-level function).

The first rank to fail (an exception: it leaves a one-line report; a signal: no report) ends the
run within a poll interval: the other ranks are terminated (then killed after a grace period) and
``spawn_ranks`` raises a one-line error naming the rank, with the rank's exit code (2 for an
invalid configuration or input, as in a single-process run).
"""
from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specdec_cli.errors import ConfigError, SpecdecError

POLL_S = 0.05
SETTLE_S = 0.5
GRACE_S = 3.0
DEBUG_ENV = "SPECDEC_DEBUG"  # the variable --debug sets (cli/output.py); the ranks inherit it


@dataclass(frozen=True)
class WorkerJob:
    """What a spawned rank runs: ``fn(ctx, *args)`` on ``device_kind``; it reports failures under ``report_dir``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    device_kind: str
    report_dir: Path


class RankFailed(SpecdecError):
    """A rank of a parallel run failed; the run was stopped."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def spawn_ranks(fn: Callable[..., Any], args: tuple[Any, ...], *, world_size: int, device_kind: str = "cpu") -> None:
    """Run ``fn(ctx, *args)`` on ``world_size`` local ranks; raise when any rank fails (see the module doc)."""
    with tempfile.TemporaryDirectory(prefix="specdec-ranks-") as tmp:
        payload = pickle.dumps(WorkerJob(fn, args, device_kind, Path(tmp)))
        port = _free_port()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(world_size):
                procs.append(_start(rank, world_size, port, payload))
            _watch(procs, Path(tmp))
        finally:
            _stop(procs)


def report_path(report_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its failure report (JSON: exit_code, lines, time)."""
    return report_dir / f"rank{rank}.json"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """A spawned rank's environment: ours, torchrun's variables and, unless ``SPECDEC_DEBUG=1`` or the user set
    it, ``TORCH_CPP_LOG_LEVEL=FATAL``: a rank whose peer died logs gloo's C++ errors (``connectFullMesh
    failed``, ``Connection closed by peer``) straight to stderr, above the launcher's one line."""
    env = {
        **os.environ,
        "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    }
    if os.environ.get(DEBUG_ENV) != "1":
        env.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    return env


def _start(rank: int, world_size: int, port: int, payload: bytes) -> subprocess.Popen[bytes]:
    env = rank_env(rank, world_size, port)
    proc = subprocess.Popen([sys.executable, "-m", "specdec_cli.parallel.worker"], stdin=subprocess.PIPE, env=env)
    assert proc.stdin is not None
    try:
        proc.stdin.write(payload)
        proc.stdin.close()
    except BrokenPipeError:  # it died at start; _watch reports it
        pass
    return proc


def _watch(procs: list[subprocess.Popen[bytes]], report_dir: Path) -> None:
    """Return when every rank exited 0; raise for the root-cause rank as soon as one fails."""
    while True:
        codes = [proc.poll() for proc in procs]
        if any(code not in (None, 0) for code in codes):
            # a failure makes its peers fail too (their collectives break): let them report,
            # then blame the rank that failed first
            time.sleep(SETTLE_S)
            codes = [proc.poll() for proc in procs]
            failed = [rank for rank, code in enumerate(codes)
                      if code not in (None, 0) or report_path(report_dir, rank).exists()]
            raise _failure(failed, codes, report_dir)
        if all(code == 0 for code in codes):
            return
        time.sleep(POLL_S)


def _failure(failed: list[int], codes: list[int | None], report_dir: Path) -> SpecdecError:
    """The root cause among ranks that failed in the same poll: a killed rank, else the earliest report."""
    reports = {rank: _read_report(report_path(report_dir, rank)) for rank in failed}

    def order(rank: int) -> tuple[bool, float]:
        return (codes[rank] or 0) >= 0, reports[rank].get("time", float("inf"))

    rank = min(failed, key=order)
    code, report = codes[rank] or 1, reports[rank]  # None: still running, but it reported
    if code < 0:
        return RankFailed(f"rank {rank} was killed by {signal.Signals(-code).name}; the run was stopped")
    if not report:
        return RankFailed(f"rank {rank} exited with code {code} without a report; the run was stopped")
    if report["exit_code"] == ConfigError.exit_code:
        return ConfigError(report["lines"])
    return RankFailed(f"rank {rank} failed: {report['lines'][0]}; the run was stopped", exit_code=report["exit_code"])


def _read_report(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate the ranks still running, then kill those that outlive the grace period."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.terminate()
    deadline = time.monotonic() + GRACE_S
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
