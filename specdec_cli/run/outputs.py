"""A job's output directory: locked for the job, written as a pair, never mixed.

- ``locked_output_dir``: before any model loads, the directory is created, proven writable and
  locked (``fcntl.flock`` on ``.specdec.lock`` inside it, held until the job ends); a second run
  pointed at it fails at once. Invalid either way: exit 2 with one ``error:`` line.
- ``write_results``: outputs.jsonl and results.json, both or neither. results.json is the commit
  marker: it is renamed into place last, and a reader that finds it finds the outputs beside it.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.schema import RunConfig
from specdec_cli.errors import ConfigError, SpecdecError
from specdec_cli.files import atomic_write_json, atomic_write_jsonl
from specdec_cli.run.result import RunResult

OUTPUTS = "outputs.jsonl"
RESULTS = "results.json"
LOCK = ".specdec.lock"


@contextlib.contextmanager
def locked_output_dir(output_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``output_dir`` (created if missing) for the ``with`` block."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=output_dir):  # can files be created here?
            pass
        fd = os.open(output_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as err:
        raise ConfigError([f"output directory {output_dir} is not writable: {err.strerror or err}"]) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError([f"output directory {output_dir} is in use by another run (it holds {LOCK}); "
                               "wait for it to finish or choose another output_dir"]) from None
        yield
    finally:
        os.close(fd)  # releases the lock


def write_results(output_dir: Path, result: RunResult) -> None:
    """outputs.jsonl, then results.json, both or neither (see the module docstring)."""
    outputs, record = output_dir / OUTPUTS, output_dir / RESULTS
    pending_outputs, pending_record = _pending(outputs), _pending(record)
    try:
        atomic_write_jsonl(pending_outputs, result.requests)
        atomic_write_json(pending_record, result.to_dict())
        record.unlink(missing_ok=True)  # an earlier run's marker: its outputs are replaced next
        os.replace(pending_outputs, outputs)
        try:
            os.replace(pending_record, record)
        except BaseException:
            outputs.unlink(missing_ok=True)
            raise
    except OSError as err:
        raise SpecdecError(f"could not write the results to {output_dir}: {err.strerror or err} "
                           "(nothing was written)") from None
    finally:
        pending_outputs.unlink(missing_ok=True)
        pending_record.unlink(missing_ok=True)


def read_results(output_dir: Path, cfg: RunConfig, effective: EffectiveConfig) -> RunResult:
    """The ``RunResult`` another process wrote to ``output_dir`` for ``cfg``."""
    record: dict[str, Any] = json.loads((output_dir / RESULTS).read_text())
    rows = [json.loads(line) for line in (output_dir / OUTPUTS).read_text().splitlines()]
    return RunResult(cfg, effective, record["metrics"], rows, record.get("parallel"))


def _pending(path: Path) -> Path:
    return path.with_name(f".{path.name}.pending")
