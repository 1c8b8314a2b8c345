"""``specdec check`` and the error boundary: exit codes, one line per problem, no traceback."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specdec_cli.cli.check import matrix_markdown
from specdec_cli.config.methods import method_names
from specdec_cli.errors import ConfigError

README = Path(__file__).resolve().parents[2] / "README.md"


def test_help(specdec) -> None:
    result = specdec("--help")
    assert result.exit_code == 0 and "check" in result.out and "run" in result.out


def test_check_prints_the_matrix(specdec) -> None:
    result = specdec("check")
    assert result.exit_code == 0 and result.err == ""
    for method in method_names():
        assert method in result.out
    assert "not implemented yet (planned)" in result.out


def test_check_explains_a_valid_combination(specdec) -> None:
    result = specdec("check", "method=eagle3", "sampler=topk")
    assert result.exit_code == 0
    assert "rejection sampling (lossless)" in result.out and "model.device=auto" in result.out


def test_check_refuses_rejection_for_ngram(specdec) -> None:
    result = specdec("check", "method=ngram", "rejection=on")
    assert result.exit_code == 2 and result.out == ""
    (line,) = result.err.splitlines()
    assert line.startswith("error: method=ngram does not support rejection sampling: ")


def test_check_lists_every_violation_one_per_line(specdec) -> None:
    result = specdec("check", "method=ngram", "rejection=on", "sampler.top_p=0", "parallelism=tp2")
    assert result.exit_code == 2
    lines = result.err.splitlines()
    assert len(lines) == 2 and all(line.startswith("error: ") for line in lines)


@pytest.mark.parametrize(
    "override", ["method.nm_draft_tokens=3", "+method.foo=1", "method.num_draft_tokens=abc", "method=medusa"]
)
def test_typos_are_one_readable_line(specdec, override: str) -> None:
    result = specdec("check", override)
    assert result.exit_code == 2
    (line,) = result.err.splitlines()
    assert line.startswith("error: ") and "Traceback" not in result.err


def test_debug_shows_the_traceback(specdec) -> None:
    with pytest.raises(ConfigError):
        specdec("--debug", "check", "method=ngram", "rejection=on")


def test_readme_carries_the_current_matrix(specdec) -> None:
    text = README.read_text()
    start = text.index("<!-- support-matrix:start -->\n") + len("<!-- support-matrix:start -->\n")
    end = text.index("<!-- support-matrix:end -->")
    assert text[start:end].strip() == matrix_markdown().strip()
    result = specdec("check", "--markdown")
    assert result.exit_code == 0 and result.out.strip() == matrix_markdown().strip()


def test_python_dash_m() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "specdec_cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "run" in done.stdout
