"""Report rows as text: display cells (terminal, Markdown) and CSV (raw numbers)."""
from __future__ import annotations

import csv
import io
from typing import Optional

from specdec_cli.report.categories import category_lines
from specdec_cli.report.collect import MissingRun
from specdec_cli.report.rows import LATENCY, PERCENTILES, ReportRow

LATENCY_COLUMNS = tuple(f"{name.upper()} ms" for name in LATENCY)

# the display columns (terminal and Markdown), in order
COLUMNS = (
    "run",
    "method",
    "sampler",
    "workload",
    "K",
    "rejection",
    "acc. length",
    "acc. rate",
    "tokens/s",
    "speed-up",
    *LATENCY_COLUMNS,
)
CSV_COLUMNS = (
    "run",
    "status",
    "method",
    "sampler",
    "workload",
    "num_draft_tokens",
    "rejection",
    "acceptance_length",
    "acceptance_rate",
    "tokens_per_s",
    "speedup",
    "per_position_acceptance",
    *(f"{name}_{q}_s" for name in LATENCY for q in PERCENTILES),
    "accepted_per_step",
    "overrides",
)
NUMERIC = frozenset({"K", "acc. length", "acc. rate", "tokens/s", "speed-up", *LATENCY_COLUMNS})
LATENCY_NOTE = ("TTFT (arrival to first token), TPOT (per output token after the first) and ITL (between "
                "output tokens): p50 / p95 in milliseconds")
SPEEDUP_NOTE = (
    "speed-up: tokens/s over the method=none run of the same sweep with the same sampler, "
    "workload, model and engine settings (blank: no such run). rejection 'on (greedy)': "
    "enabled, but all requests were greedy, so the argmax path ran instead"
)


def display_cells(row: ReportRow) -> list[str]:
    """The row's cells as displayed, in ``COLUMNS`` order."""
    return [
        row.run,
        row.method,
        row.sampler,
        row.workload,
        str(row.k),
        row.rejection,
        _fmt(row.acceptance_length, "{:.2f}"),
        _fmt(row.acceptance_rate, "{:.1%}"),
        _fmt(row.tokens_per_s, "{:.1f}"),
        _fmt(row.speedup, "{:.2f}×"),
        *latency_cells(row),
    ]


def latency_cells(row: ReportRow) -> list[str]:
    """``p50 / p95`` in milliseconds per latency metric (``LATENCY`` order); blank without numbers."""
    seconds = dict(row.latency_s)
    cells = []
    for name in LATENCY:
        p50, p95 = (seconds.get(f"{name}_{q}") for q in PERCENTILES)
        cells.append("" if p50 is None or p95 is None else f"{p50 * 1e3:.1f} / {p95 * 1e3:.1f}")
    return cells


def missing_line(missing: MissingRun) -> str:
    """One line per run without results: where, why, and the overrides that made it."""
    overrides = " ".join(missing.overrides) if missing.overrides else "overrides unknown"
    return f"{missing.run}: {missing.status} [{overrides}]"


def to_markdown(
    title: str, rows: list[ReportRow], missing: tuple[MissingRun, ...], plots: list[str]
) -> str:
    """The whole ``report.md``: the table, the missing runs, links to the plots."""
    align = ["---:" if header in NUMERIC else "---" for header in COLUMNS]
    lines = [f"# {title}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(_escape(c) for c in display_cells(row)) + " |" for row in rows]
    lines += ["", SPEEDUP_NOTE + ".", "", LATENCY_NOTE + "."] + category_lines(rows)
    if missing:
        lines += ["", f"## Missing or failed runs ({len(missing)})", ""]
        lines += [f"- `{m.run}`: {m.status}; overrides: `{' '.join(m.overrides) or '?'}`" for m in missing]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in plots]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[ReportRow], missing: tuple[MissingRun, ...]) -> str:
    """``report.csv``: one line per run with raw numbers; runs without results have status != ok."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({
            "run": row.run, "status": "ok", "method": row.method, "sampler": row.sampler,
            "workload": row.workload, "num_draft_tokens": row.k, "rejection": row.rejection,
            "acceptance_length": _raw(row.acceptance_length),
            "acceptance_rate": _raw(row.acceptance_rate),
            "tokens_per_s": _raw(row.tokens_per_s), "speedup": _raw(row.speedup),
            "per_position_acceptance": " ".join(f"{x:.4f}" for x in row.per_position),
            **{f"{key}_s": _raw(value) for key, value in row.latency_s},
            "accepted_per_step": " ".join(str(n) for n in row.accepted_per_step),
            "overrides": "",
        })
    for item in missing:
        writer.writerow({"run": item.run, "status": item.status, "overrides": " ".join(item.overrides)})
    return buffer.getvalue()


def _fmt(value: Optional[float], pattern: str) -> str:
    return "" if value is None else pattern.format(value)


def _raw(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.6g}"


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|")
