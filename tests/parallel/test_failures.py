"""A failing rank ends the whole run quickly with a one-line error naming it, never a hang."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from specdec_cli.errors import ConfigError
from specdec_cli.parallel.comm import Comm
from specdec_cli.parallel.gather import GatherPolicy
from specdec_cli.parallel.launch import RankFailed, _failure, rank_env, report_path, spawn_ranks
from specdec_cli.parallel.shard import shard_transformer
from specdec_cli.testing import toy_model

BOUND_S = 30.0


def run_failing(how: str) -> tuple[RankFailed, float]:
    from rank_failures import fail_on_rank_1  # the ranks import it by this name too

    start = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        spawn_ranks(fail_on_rank_1, (how,), world_size=2)
    return failure.value, time.monotonic() - start


def test_an_exception_in_one_rank_stops_the_run() -> None:
    error, elapsed = run_failing("raise")
    assert str(error) == "rank 1 failed: ValueError: boom on purpose; the run was stopped"
    assert error.exit_code == 1 and elapsed < BOUND_S


def test_a_killed_rank_stops_the_run(capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_DEBUG", "0")
    error, elapsed = run_failing("kill")
    assert str(error) == "rank 1 was killed by SIGKILL; the run was stopped"
    assert elapsed < BOUND_S
    assert capfd.readouterr().err == ""  # the peer's broken-collective traceback is not shown


def test_debug_shows_the_ranks_tracebacks(capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_DEBUG", "1")
    run_failing("raise")
    err = capfd.readouterr().err
    assert "[rank 1] Traceback" in err and "ValueError: boom on purpose" in err


def test_a_hanging_rank_times_out_the_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_COLLECTIVE_TIMEOUT_S", "3")
    error, elapsed = run_failing("hang")
    message = str(error)
    assert message.startswith("rank 0 failed: ") and "Timed out" in message and "\n" not in message
    assert elapsed < BOUND_S


def test_a_model_that_cannot_be_split_is_a_config_error() -> None:
    model = toy_model(0, num_heads=4, num_kv_heads=1)
    with pytest.raises(ConfigError, match="needs at least 2 key/value heads"):
        shard_transformer(model, Comm(rank=0, size=2), policy=GatherPolicy.ALL_LOGITS, label="target")


def test_the_root_cause_is_blamed_and_config_errors_keep_exit_code_2(tmp_path: Path) -> None:
    """Ranks that fail together: a killed rank first, else the earliest report; a rank's invalid
    configuration or input is reported like a single-process one (every line, exit code 2)."""
    def report(rank: int, exit_code: int, lines: list[str], at: float) -> None:
        report_path(tmp_path, rank).write_text(json.dumps({"exit_code": exit_code, "lines": lines, "time": at}))

    report(0, 1, ["RuntimeError: Connection closed by peer"], at=2.0)
    report(1, 2, ["model too small", "prompt too long"], at=1.0)
    error = _failure([0, 1], [1, 2], tmp_path)
    assert isinstance(error, ConfigError) and error.violations == ["model too small", "prompt too long"]
    assert str(_failure([0, 1], [1, -9], tmp_path)) == "rank 1 was killed by SIGKILL; the run was stopped"


def test_ranks_keep_their_cpp_logs_to_themselves_unless_debugging(monkeypatch: pytest.MonkeyPatch) -> None:
    """gloo's C++ errors of a rank whose peer died (``connectFullMesh failed``) go straight to stderr: a rank
    runs with TORCH_CPP_LOG_LEVEL=FATAL, except under --debug or where the user chose a level."""
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    monkeypatch.setenv("SPECDEC_DEBUG", "0")
    env = rank_env(1, 2, 29500)
    assert env["TORCH_CPP_LOG_LEVEL"] == "FATAL" and env["RANK"] == "1" and env["MASTER_PORT"] == "29500"
    monkeypatch.setenv("SPECDEC_DEBUG", "1")
    assert "TORCH_CPP_LOG_LEVEL" not in rank_env(1, 2, 29500)
    monkeypatch.setenv("SPECDEC_DEBUG", "0")
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO")
    assert rank_env(1, 2, 29500)["TORCH_CPP_LOG_LEVEL"] == "INFO"
