"""The output directory of a job: checked and locked before any model loads; results written as a pair."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from specdec_cli.config.compose import compose_config
from specdec_cli.config.validate import resolve
from specdec_cli.engine.metrics import SpecStats
from specdec_cli.errors import ConfigError, SpecdecError
from specdec_cli.run import job as job_module
from specdec_cli.run import outputs
from specdec_cli.run.job import run_job
from specdec_cli.run.outputs import locked_output_dir, read_results, write_results
from specdec_cli.run.result import RunResult, run_metrics

HOLD_LOCK = """
import sys
from pathlib import Path
from specdec_cli.run.outputs import locked_output_dir
with locked_output_dir(Path(sys.argv[1])):
    print("locked", flush=True)
    sys.stdin.read()  # until the test closes our stdin
"""


@pytest.fixture
def never_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the job gets as far as loading a model."""
    def build(*args, **kwargs):
        raise AssertionError("the job loaded a model")

    monkeypatch.setattr(job_module, "build_pipeline", build)


@pytest.fixture
def locked_elsewhere(tmp_path: Path) -> Iterator[Path]:
    """A directory whose lock another process holds."""
    held = tmp_path / "held"
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(held)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    yield held
    proc.communicate(timeout=30)


def result(rows: int = 2) -> RunResult:
    cfg = compose_config(["method=ngram"])
    metrics = run_metrics(SpecStats(), 0.5, rows)
    return RunResult(cfg, resolve(cfg), metrics, [{"id": str(i), "output_token_ids": [i]} for i in range(rows)])


def test_an_unwritable_output_dir_fails_before_any_model_loads(tmp_path: Path, never_build) -> None:
    regular = tmp_path / "a_file"
    regular.write_text("not a directory")
    cfg = compose_config(["method=ngram", f"output_dir={regular / 'out'}"])
    with pytest.raises(ConfigError) as error:
        run_job(cfg, resolve(cfg), regular / "out")
    (line,) = error.value.violations
    assert line.startswith(f"output directory {regular / 'out'} is not writable: ")


def test_a_locked_output_dir_fails_at_once(locked_elsewhere: Path, never_build) -> None:
    cfg = compose_config(["method=ngram"])
    with pytest.raises(ConfigError) as error:
        run_job(cfg, resolve(cfg), locked_elsewhere)
    (line,) = error.value.violations
    assert line.startswith(f"output directory {locked_elsewhere} is in use by another run")


def test_the_lock_is_released_when_the_job_ends(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with locked_output_dir(tmp_path):
            raise RuntimeError("the job failed")
    with locked_output_dir(tmp_path):  # free again
        with pytest.raises(ConfigError, match="in use by another run"):
            with locked_output_dir(tmp_path):  # but exclusive while held
                pass


def test_results_are_written_as_a_pair(tmp_path: Path) -> None:
    done = result()
    write_results(tmp_path, done)
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(json.dumps(done.to_dict()))
    assert [json.loads(line) for line in (tmp_path / "outputs.jsonl").read_text().splitlines()] == done.requests
    assert read_results(tmp_path, done.config, done.effective).requests == done.requests
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs.jsonl", "results.json"]


def test_a_failed_commit_leaves_neither_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_results(tmp_path, result(1))  # an earlier run's pair
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name == "results.json":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(outputs.os, "replace", replace)
    with pytest.raises(SpecdecError, match="No space left on device.*nothing was written"):
        write_results(tmp_path, result(3))
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_keeps_the_earlier_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    earlier = result(1)
    write_results(tmp_path, earlier)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def fail(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs, "atomic_write_json", fail)
    with pytest.raises(SpecdecError):
        write_results(tmp_path, result(3))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
