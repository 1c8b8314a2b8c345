"""The per-category section of report.md: acceptance and throughput per MT-Bench / Spec-Bench category
(``metrics.per_category`` of each run, see ``run/result.py``)."""
from __future__ import annotations

from typing import Any

from specdec_cli.report.rows import ReportRow

HEADER = ("run", "method", "category", "requests", "acc. length", "tokens/s")


def category_lines(rows: list[ReportRow]) -> list[str]:
    """Markdown lines of the per-category table over every row that has categories; [] when none has."""
    body = [
        f"| {row.run} | {row.method} | {category} | {values.get('num_requests', '')} | "
        f"{_number(values.get('acceptance_length'), '{:.2f}')} | {_number(values.get('tokens_per_s'), '{:.1f}')} |"
        for row in rows for category, values in row.per_category
    ]
    if not body:
        return []
    align = "|---|---|---|---:|---:|---:|"
    return ["", "## Per category", "", "| " + " | ".join(HEADER) + " |", align, *body]


def _number(value: Any, pattern: str) -> str:
    return pattern.format(value) if isinstance(value, (int, float)) else ""
