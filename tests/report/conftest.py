"""Fixtures: a synthetic sweep directory, and ``specdec`` invoked in-process."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest

from report.report_trees import make_sweep
from specdec_cli.cli.main import main


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    return make_sweep(tmp_path / "sweep")


@pytest.fixture
def run_specdec(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple]:
    """``run_specdec("run", ...)`` -> (exit code, stdout, stderr), through the real entry point."""
    monkeypatch.setenv("SPECDEC_DEBUG", "0")

    def invoke(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["specdec", *args])
        with pytest.raises(SystemExit) as exit_info:
            main()
        captured = capsys.readouterr()
        return exit_info.value.code or 0, captured.out, captured.err

    return invoke
