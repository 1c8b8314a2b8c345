"""``specdec`` invoked in-process through its real entry point (the error boundary included)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import pytest

from specdec_cli.cli.main import main


@dataclass
class Result:
    exit_code: int
    out: str
    err: str


@pytest.fixture
def specdec(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """``specdec("check", "method=ngram")`` -> exit code, stdout, stderr."""
    monkeypatch.setenv("SPECDEC_DEBUG", "0")  # restored after the test even if --debug sets it

    def invoke(*args: str) -> Result:
        monkeypatch.setattr(sys, "argv", ["specdec", *args])
        with pytest.raises(SystemExit) as exit_info:
            main()
        captured = capsys.readouterr()
        return Result(exit_info.value.code or 0, captured.out, captured.err)

    return invoke
