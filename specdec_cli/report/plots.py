"""PNG plots of a report (matplotlib's Agg canvas; no pyplot, no display needed).

- ``acceptance_speedup.png``: acceptance length and speed-up per method × sampler (grouped bars);
- ``per_position_acceptance.png``: P(draft i accepted | proposed) per run;
- ``tokens_per_s_vs_k.png``: throughput against the draft length K per method × sampler;
- ``accepted_per_step.png``: the share of verify steps that accepted 0, 1, ..., K drafts, per run;
- ``time_breakdown.png``: milliseconds per generated token, stacked by phase (target forward, draft,
  accept, other), per run.

Runs that share a bar or a point (other sweeps, temperatures folded into one sampler label)
are averaged. Every plot is written even without data (it then says so), atomically.
"""
from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path
from statistics import fmean
from typing import Callable, Optional

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from specdec_cli.files import atomic_write_bytes
from specdec_cli.report.rows import ReportRow

PLOT_NAMES = ("acceptance_speedup.png", "per_position_acceptance.png", "tokens_per_s_vs_k.png",
              "accepted_per_step.png", "time_breakdown.png")


def write_plots(rows: list[ReportRow], out_dir: Path) -> list[str]:
    """Write every plot into ``out_dir``; returns their file names."""
    painters: tuple[Callable[[list[ReportRow]], Figure], ...] = (
        acceptance_speedup_figure,
        per_position_figure,
        tokens_per_s_figure,
        accepted_per_step_figure,
        time_breakdown_figure,
    )
    for name, paint in zip(PLOT_NAMES, painters):
        atomic_write_bytes(out_dir / name, figure_png(paint(rows)))
    return list(PLOT_NAMES)


def figure_png(figure: Figure) -> bytes:
    """The figure rendered as PNG bytes."""
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


def bar_groups(rows: list[ReportRow]) -> dict[str, str]:
    """Run -> bar group label: the method, with K when that method ran at several K."""
    ks: dict[str, set[int]] = defaultdict(set)
    for row in rows:
        ks[row.method].add(row.k)
    return {row.run: f"{row.method} K={row.k}" if len(ks[row.method]) > 1 else row.method for row in rows}


def grouped_means(
    rows: list[ReportRow], value: Callable[[ReportRow], Optional[float]]
) -> tuple[list[str], list[str], dict[tuple[str, str], float]]:
    """(groups, samplers, mean value per (group, sampler)) over the rows that have a value."""
    labels = bar_groups(rows)
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in rows:
        number = value(row)
        if number is not None:
            cells[(labels[row.run], row.sampler)].append(number)
    groups = list(dict.fromkeys(labels[row.run] for row in rows))
    samplers = list(dict.fromkeys(row.sampler for row in rows))
    return groups, samplers, {key: fmean(values) for key, values in cells.items()}


def acceptance_speedup_figure(rows: list[ReportRow]) -> Figure:
    """Grouped bars: acceptance length (top) and speed-up (bottom) per method × sampler."""
    figure = Figure(figsize=(max(6.0, 1.4 * len({r.method for r in rows}) + 3), 7.5))
    top, bottom = figure.subplots(2, 1)
    _grouped_bars(top, rows, lambda r: r.acceptance_length, "acceptance length (tokens / step)")
    _grouped_bars(bottom, rows, lambda r: r.speedup, "speed-up vs method=none")
    if any(r.speedup is not None for r in rows):
        bottom.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    figure.suptitle("acceptance and speed-up per method × sampler")
    return figure


def _grouped_bars(axes: Axes, rows: list[ReportRow], value: Callable[[ReportRow], Optional[float]],
                  ylabel: str) -> None:
    groups, samplers, means = grouped_means(rows, value)
    axes.set_ylabel(ylabel)
    if not means:
        _no_data(axes, f"no data for {ylabel}")
        return
    width = 0.8 / max(len(samplers), 1)
    for index, sampler in enumerate(samplers):
        xs = [g + index * width - 0.4 + width / 2 for g in range(len(groups))]
        heights = [means.get((group, sampler), 0.0) for group in groups]
        axes.bar(xs, heights, width=width, label=sampler)
    axes.set_xticks(range(len(groups)))
    axes.set_xticklabels(groups, rotation=20, ha="right")
    axes.legend(fontsize="small", title="sampler")


def per_position_figure(rows: list[ReportRow]) -> Figure:
    """One acceptance curve over draft positions per speculative run."""
    figure = Figure(figsize=(7, 4.5))
    axes = figure.subplots()
    drawn = [row for row in rows if row.per_position]
    for row in drawn:
        positions = range(1, len(row.per_position) + 1)
        axes.plot(positions, row.per_position, marker="o", label=f"{row.method} {row.sampler} K={row.k}")
    axes.set_xlabel("draft position")
    axes.set_ylabel("P(accepted | proposed)")
    axes.set_ylim(0, 1.05)
    axes.set_title("per-position acceptance")
    if drawn:
        axes.legend(fontsize="x-small", ncol=2 if len(drawn) > 8 else 1)
    else:
        _no_data(axes, "no speculative runs with drafts")
    return figure


def tokens_per_s_figure(rows: list[ReportRow]) -> Figure:
    """Tokens/s against K, one line per method × sampler (method=none sits at K=0)."""
    figure = Figure(figsize=(7, 4.5))
    axes = figure.subplots()
    series: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row.tokens_per_s is not None:
            series[f"{row.method} {row.sampler}"][row.k].append(row.tokens_per_s)
    for label, points in series.items():
        ks = sorted(points)
        axes.plot(ks, [fmean(points[k]) for k in ks], marker="o", label=label)
    axes.set_xlabel("K (num_draft_tokens)")
    axes.set_ylabel("tokens / s")
    axes.set_title("throughput vs draft length")
    if series:
        axes.legend(fontsize="x-small", ncol=2 if len(series) > 8 else 1)
    else:
        _no_data(axes, "no throughput numbers")
    return figure


def accepted_per_step_figure(rows: list[ReportRow]) -> Figure:
    """Grouped bars: for each speculative run, the share of its verify steps that accepted i drafts."""
    figure = Figure(figsize=(7, 4.5))
    axes = figure.subplots()
    drawn = [row for row in rows if sum(row.accepted_per_step) > 0 and row.k > 0]
    width = 0.8 / max(len(drawn), 1)
    for index, row in enumerate(drawn):
        total = sum(row.accepted_per_step)
        xs = [i + index * width - 0.4 + width / 2 for i in range(len(row.accepted_per_step))]
        axes.bar(xs, [n / total for n in row.accepted_per_step], width=width,
                 label=f"{row.method} {row.sampler} K={row.k}")
    axes.set_xlabel("drafts accepted in a verify step")
    axes.set_ylabel("share of verify steps")
    axes.set_title("accepted tokens per step")
    if drawn:
        axes.set_xticks(range(max(len(row.accepted_per_step) for row in drawn)))
        axes.legend(fontsize="x-small", ncol=2 if len(drawn) > 8 else 1)
    else:
        _no_data(axes, "no speculative runs with a step histogram (metrics.accepted_per_step)")
    return figure


def time_breakdown_figure(rows: list[ReportRow]) -> Figure:
    """Stacked bars: milliseconds per generated token in each phase of the step, per run."""
    drawn = [row for row in rows if row.ms_per_token]
    figure = Figure(figsize=(max(6.0, 0.9 * len(drawn) + 3), 4.8))
    axes = figure.subplots()
    phases = list(dict.fromkeys(phase for row in drawn for phase, _ in row.ms_per_token))
    bottoms = [0.0] * len(drawn)
    for phase in phases:
        heights = [dict(row.ms_per_token).get(phase, 0.0) for row in drawn]
        axes.bar(range(len(drawn)), heights, bottom=bottoms, label=phase)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    axes.set_ylabel("ms per generated token")
    axes.set_title("where a token's time goes (metrics.time_breakdown_s)")
    if drawn:
        axes.set_xticks(range(len(drawn)))
        axes.set_xticklabels([f"{row.method} {row.sampler} K={row.k}" for row in drawn], rotation=25, ha="right",
                             fontsize="small")
        axes.legend(fontsize="small", title="phase")
    else:
        _no_data(axes, "no runs with a time breakdown (metrics.time_breakdown_s)")
    return figure


def _no_data(axes: Axes, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes)
