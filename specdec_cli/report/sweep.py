"""``specdec report``'s pipeline: collect -> rows -> report.md / report.csv / plots.

``build_report`` reads (``collect.py``) and shapes (``rows.py``); ``write_report`` writes the
files atomically (``tables.py``, ``plots.py``). Neither prints: the command does.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdec_cli.report.collect import MissingRun, collect_runs
from specdec_cli.files import atomic_write_text
from specdec_cli.report.rows import ReportRow, build_rows
from specdec_cli.report.tables import to_csv, to_markdown

MARKDOWN_NAME = "report.md"
CSV_NAME = "report.csv"


@dataclass(frozen=True)
class SweepReport:
    root: Path
    rows: list[ReportRow]
    missing: tuple[MissingRun, ...]


def build_report(root: Path) -> SweepReport:
    """Every run below ``root`` as rows (``ConfigError`` when there are none)."""
    collection = collect_runs(root)
    return SweepReport(collection.root, build_rows(collection.runs), collection.missing)


def write_report(report: SweepReport, out_dir: Path, *, plots: bool = True) -> list[Path]:
    """Write ``report.md``, ``report.csv`` and (unless ``plots=False``) the PNGs; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_names: list[str] = []
    if plots:
        from specdec_cli.report.plots import write_plots  # matplotlib loads only when plotting

        plot_names = write_plots(report.rows, out_dir)
    title = f"specdec report: {report.root}"
    atomic_write_text(out_dir / MARKDOWN_NAME, to_markdown(title, report.rows, report.missing, plot_names))
    atomic_write_text(out_dir / CSV_NAME, to_csv(report.rows, report.missing))
    return [out_dir / MARKDOWN_NAME, out_dir / CSV_NAME] + [out_dir / name for name in plot_names]
