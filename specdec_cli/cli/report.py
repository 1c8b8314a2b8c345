"""``specdec report``: one table (terminal, report.md, report.csv) and plots for a run or sweep."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from specdec_cli.cli.output import console
from specdec_cli.report.sweep import SweepReport, build_report, write_report
from specdec_cli.report.tables import COLUMNS, NUMERIC, SPEEDUP_NOTE, display_cells, missing_line


def report(
    directory: Annotated[Path, typer.Argument(help="A run or multirun (sweep) directory.")],
    out: Annotated[
        Optional[Path], typer.Option("--out", help="Write report.md/.csv and plots here (default: DIRECTORY).")
    ] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write the PNG plots.")] = True,
) -> None:
    """Collect every results.json below DIRECTORY into one table, report.md, report.csv and plots.

    \b
    specdec report multirun/2026-12-02/17-00-00
    specdec report outputs/ --out reports/today --no-plots
    Job directories without results (failed, dry run) are listed. No results at all: exit 2.
    """
    summary = build_report(directory)
    written = write_report(summary, out if out is not None else directory, plots=plots)
    _print_report(summary)
    console.print(f"wrote: {', '.join(str(p) for p in written)}", markup=False, soft_wrap=True)


def _print_report(summary: SweepReport) -> None:
    table = Table(title=f"runs in {summary.root}", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    for header in COLUMNS:
        table.add_column(header, justify="right" if header in NUMERIC else "left", no_wrap=True)
    for row in summary.rows:
        table.add_row(*(Text(cell) for cell in display_cells(row)))
    # never truncate cells: a table wider than the terminal overflows it instead
    lines = console.render_lines(table, console.options.update(width=10_000), pad=False)
    needed = max(Segment.get_line_length(line) for line in lines)
    if needed > console.width:
        table.width = needed
    console.print(table, crop=False)
    console.print(SPEEDUP_NOTE, markup=False, highlight=False, soft_wrap=True)
    if summary.missing:
        console.print(Text(f"missing or failed runs ({len(summary.missing)}):", style="bold yellow"))
        for item in summary.missing:
            console.print(Text(f"  - {missing_line(item)}"), soft_wrap=True)
