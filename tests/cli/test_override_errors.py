"""Command-line mistakes are one ``error:`` line (exit 2): a flag ``specdec check`` does not take, and a config
group chosen twice (Hydra would silently take the last) in run, check, train, serve and the Python API."""
from __future__ import annotations

from pathlib import Path

import pytest

from specdec_cli.api.llm import LLM
from specdec_cli.errors import ConfigError

from cli_runner import run_cli_main as specdec

QUIET = ("hydra/job_logging=disabled", "hydra/hydra_logging=disabled")
TWICE = "error: method given twice (method=ngram, method=eagle3): choose it once (sweep with -m method=a,b)"


def test_check_with_a_sweep_flag_is_an_error_line(monkeypatch, capsys) -> None:
    code, _, err = specdec(monkeypatch, capsys, "check", "-m", "method=ngram")
    assert code == 2
    assert err.splitlines() == ["error: specdec check takes overrides, not -m: it checks one configuration "
                                "(sweeps with -m are for specdec run)"]


@pytest.mark.parametrize("command", ["run", "check", "train", "serve"])
def test_a_group_given_twice_is_refused(monkeypatch, capsys, tmp_path: Path, command: str) -> None:
    extra = (f"hydra.run.dir={tmp_path}", *QUIET) if command in ("run", "train") else ()
    code, _, err = specdec(monkeypatch, capsys, command, "method=ngram", "method=eagle3", *extra)
    assert (code, err.splitlines()) == (2, [TWICE])


def test_the_python_api_refuses_a_group_given_twice() -> None:
    with pytest.raises(ConfigError, match="method given twice"):
        LLM(["method=ngram", "method=eagle3"])


def test_a_sweep_over_one_group_still_runs(monkeypatch, capsys, tmp_path: Path) -> None:
    code, out, _ = specdec(monkeypatch, capsys, "run", "-m", "method=ngram,suffix", "method.num_draft_tokens=3",
                           "method.num_draft_tokens=2", "dry_run=true", f"hydra.sweep.dir={tmp_path}", *QUIET)
    assert code == 0
    assert "ngram" in out and "suffix" in out and "method given twice" not in out
