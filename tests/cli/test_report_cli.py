"""``specdec report`` through the real entry point: table, files, listed failures, exit codes."""
from __future__ import annotations

from pathlib import Path

import pytest

from report.report_trees import make_sweep, write_job


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    return make_sweep(tmp_path / "sweep")


def test_report_prints_the_table_and_writes_files(specdec, sweep_dir: Path) -> None:
    result = specdec("report", str(sweep_dir))
    assert result.exit_code == 0, result.err
    assert result.err == ""
    assert "draft_target(self=4)" in result.out and "2.10×" in result.out and "1.50×" in result.out
    assert "missing or failed runs (1):" in result.out
    assert "4: failed or not run (no results.json) [method=draft_target sampler=topk" in result.out
    for name in ("report.md", "report.csv", "acceptance_speedup.png", "per_position_acceptance.png",
                 "tokens_per_s_vs_k.png"):
        assert (sweep_dir / name).stat().st_size > 0


def test_report_out_dir_and_no_plots(specdec, sweep_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "reports" / "today"
    result = specdec("report", str(sweep_dir), "--out", str(out), "--no-plots")
    assert result.exit_code == 0, result.err
    assert sorted(p.name for p in out.iterdir()) == ["report.csv", "report.md"]
    assert not (sweep_dir / "report.md").exists()


def test_report_without_results_exits_2_in_one_line(specdec, tmp_path: Path) -> None:
    write_job(tmp_path / "0", ["method=eagle3"], None)
    result = specdec("report", str(tmp_path))
    assert result.exit_code == 2
    (line,) = result.err.splitlines()
    assert line.startswith("error: ") and "no results.json found" in line and "Traceback" not in result.err
    assert not (tmp_path / "report.md").exists()


def test_report_on_a_missing_directory_exits_2(specdec, tmp_path: Path) -> None:
    result = specdec("report", str(tmp_path / "nope"))
    assert result.exit_code == 2 and "not a directory" in result.err
