"""``python -m specdec_cli.parallel.worker``: one rank spawned by ``launch.spawn_ranks``.

Reads a pickled ``WorkerJob`` from stdin, joins the group described by its environment and runs
``fn(ctx, *args)``. On failure it writes a one-line report for the launcher and exits with the error's
code; the traceback of an unexpected error goes to stderr, prefixed with the rank, only under ``--debug``
(``SPECDEC_DEBUG=1``, inherited from the launcher): a rank whose peer died would print a page of gloo
traceback before the launcher's one line.
"""
from __future__ import annotations

import json
import os
import pickle
import sys
import time
import traceback

from specdec_cli.errors import ConfigError, SpecdecError
from specdec_cli.parallel.context import distributed
from specdec_cli.parallel.launch import DEBUG_ENV, WorkerJob, report_path


def _report(err: BaseException) -> tuple[list[str], int]:
    """(lines, exit code) for an error: every violation of a ``ConfigError``, else one line."""
    if isinstance(err, ConfigError):
        return err.violations, err.exit_code
    text = str(err).strip().splitlines()[0][:400] if str(err).strip() else ""
    if isinstance(err, SpecdecError):
        return [text], err.exit_code
    return [f"{type(err).__name__}: {text}"], 1


#: each rank's context (its store, and so the TCPStore server on rank 0) outlives ``main``: the
#: process leaves with ``os._exit`` before any of their C++ destructors can run (see below)
_KEEP: list[object] = []


def main() -> int:
    """Run the job on stdin as the rank the environment names; returns the exit code."""
    job: WorkerJob = pickle.load(sys.stdin.buffer)
    rank = int(os.environ["RANK"])
    failed_at = None
    try:
        with distributed(job.device_kind) as ctx:
            _KEEP.append(ctx)
            try:
                job.fn(ctx, *job.args)
            except Exception:
                # stamped before leaving the group: peers fail only once this rank has left,
                # so the earliest stamp names the root cause
                failed_at = time.time()
                raise
    except Exception as err:
        lines, code = _report(err)
        if code == 1 and not isinstance(err, SpecdecError) and os.environ.get(DEBUG_ENV) == "1":
            sys.stderr.write(f"[rank {rank}] " + "".join(traceback.format_exception(err)))
        report = {"exit_code": code, "lines": lines, "time": failed_at or time.time()}
        report_path(job.report_dir, rank).write_text(json.dumps(report))
        return code
    return 0


if __name__ == "__main__":
    code = main()
    # skip interpreter finalisation: C++ destructors of c10d's helper threads (store server, gloo
    # transport) at exit can abort with "terminate called without an active exception" after the
    # job has succeeded; everything this rank writes is closed by now, so flush and leave at once
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
