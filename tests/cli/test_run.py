"""``specdec run``: a real Hydra app that validates, dry-runs, skips, or hands over to the job."""
from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.schema import RunConfig
from specdec_cli.engine.metrics import SpecStats
from specdec_cli.errors import ConfigError
from specdec_cli.run.outputs import locked_output_dir
from specdec_cli.run.result import RunResult, run_metrics

SPECDEC = Path(sys.executable).parent / "specdec"
# in-process runs: Hydra must not attach log handlers to pytest's captured streams
QUIET = ("hydra/job_logging=disabled", "hydra/hydra_logging=disabled")


@pytest.fixture
def engine_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Replace the job module (specdec_cli.run.job) with a recorder (no torch models are loaded)."""
    calls: list[tuple] = []

    def run_job(cfg: RunConfig, effective: EffectiveConfig, output_dir: Path) -> RunResult:
        calls.append((cfg, effective, output_dir))
        if cfg.workload.name == "jsonl":
            raise ConfigError(["prompts.jsonl:3: not valid JSON"])
        return RunResult(cfg, effective, run_metrics(SpecStats(), 0.0, 0), [])

    fake = types.ModuleType("specdec_cli.run.job")
    fake.run_job = run_job  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "specdec_cli.run.job", fake)
    return calls


def test_run_hands_typed_config_to_the_engine(specdec, engine_calls, tmp_path: Path) -> None:
    result = specdec("run", "method=eagle3", "sampler=topk", f"hydra.run.dir={tmp_path}", *QUIET)
    assert result.exit_code == 0, result.err
    ((cfg, effective, output_dir),) = engine_calls
    assert isinstance(cfg, RunConfig) and cfg.method.name == "eagle3" and cfg.sampler.top_k == 20
    assert isinstance(effective, EffectiveConfig) and effective.rejection
    assert output_dir == tmp_path


def test_output_dir_overrides_hydras(specdec, engine_calls, tmp_path: Path) -> None:
    target = tmp_path / "mine"
    result = specdec("run", f"output_dir={target}", f"hydra.run.dir={tmp_path / 'hydra'}", *QUIET)
    assert result.exit_code == 0 and engine_calls[0][2] == target


def test_invalid_combination_exits_2_and_writes_nothing(specdec, engine_calls, tmp_path: Path) -> None:
    result = specdec("run", "method=ngram", "rejection=on", f"hydra.run.dir={tmp_path}", *QUIET)
    assert result.exit_code == 2 and engine_calls == []
    (line,) = result.err.splitlines()
    assert line.startswith("error: method=ngram does not support rejection sampling")
    assert not (tmp_path / "results.json").exists() and not (tmp_path / "effective.json").exists()


@pytest.mark.parametrize("override", ["method.foo=1", "method=medusa", "sampler.top_k=many"])
def test_override_errors_exit_2_in_one_line(specdec, engine_calls, tmp_path: Path, override: str) -> None:
    result = specdec("run", override, f"hydra.run.dir={tmp_path}", *QUIET)
    assert result.exit_code == 2 and engine_calls == []
    (line,) = result.err.splitlines()
    assert line.startswith("error: ") and "Traceback" not in result.err


def test_engine_input_errors_exit_2(specdec, engine_calls, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')  # valid, so the (fake) job's own error is what surfaces
    args = ("workload=jsonl", f"workload.path={prompts}", f"hydra.run.dir={tmp_path}", *QUIET)
    result = specdec("run", *args)
    assert result.exit_code == 2 and result.err.strip() == "error: prompts.jsonl:3: not valid JSON"


def test_an_unwritable_output_dir_exits_2_before_loading(specdec, tmp_path: Path) -> None:
    regular = tmp_path / "a_file"
    regular.write_text("")
    result = specdec("run", "method=ngram", f"output_dir={regular / 'out'}", f"hydra.run.dir={tmp_path}", *QUIET)
    assert result.exit_code == 2
    (line,) = result.err.splitlines()
    assert line.startswith(f"error: output directory {regular / 'out'} is not writable")


def test_a_second_run_into_a_locked_output_dir_exits_2_at_once(specdec, tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    with locked_output_dir(busy):  # a run in progress (flock: any other open of the lock file conflicts)
        result = specdec("run", "method=ngram", f"output_dir={busy}", f"hydra.run.dir={tmp_path}", *QUIET)
    assert result.exit_code == 2
    (line,) = result.err.splitlines()
    assert line.startswith(f"error: output directory {busy} is in use by another run")
    assert not (busy / "results.json").exists() and not (busy / "outputs.jsonl").exists()


def test_dry_run_writes_effective_json(specdec, engine_calls, tmp_path: Path) -> None:
    result = specdec("run", "method=pard", "dry_run=true", f"hydra.run.dir={tmp_path}", *QUIET)
    assert result.exit_code == 0 and engine_calls == []
    record = json.loads((tmp_path / "effective.json").read_text())
    assert record["config"]["method"]["name"] == "pard" and record["effective"]["rejection"] is True
    assert "effective settings" in result.out


def test_skip_if_done(specdec, engine_calls, tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text("{}")
    result = specdec("run", "skip_if_done=true", f"hydra.run.dir={tmp_path}", *QUIET)
    assert result.exit_code == 0 and engine_calls == [] and "skipped" in result.out


def test_a_failing_sweep_job_is_reported_and_the_others_run(specdec, engine_calls, tmp_path: Path) -> None:
    args = ("-m", "method=ngram,eagle3", "rejection=on", "dry_run=true", f"hydra.sweep.dir={tmp_path}")
    result = specdec("run", *args, *QUIET)
    assert result.exit_code == 2
    assert "error: job 0 (method=ngram rejection=on dry_run=True): method=ngram does not support" in result.err
    assert not (tmp_path / "0" / "effective.json").exists()
    assert json.loads((tmp_path / "1" / "effective.json").read_text())["config"]["method"]["name"] == "eagle3"


def test_multirun_sweep_is_real_hydra(tmp_path: Path) -> None:
    args = ["run", "-m", "method=none,ngram", "sampler=greedy,temperature", "dry_run=true"]
    done = subprocess.run(
        [str(SPECDEC), *args, f"hydra.sweep.dir={tmp_path}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1", "2", "3"]
    seen = set()
    for job in jobs:
        record = json.loads((job / "effective.json").read_text())
        overrides = (job / ".hydra" / "overrides.yaml").read_text()
        method, sampler = record["config"]["method"]["name"], record["config"]["sampler"]["name"]
        assert f"method={method}" in overrides and f"sampler={sampler}" in overrides
        assert record["effective"]["all_greedy"] == (sampler == "greedy")
        seen.add((method, sampler))
    assert seen == {(m, s) for m in ("none", "ngram") for s in ("greedy", "temperature")}
