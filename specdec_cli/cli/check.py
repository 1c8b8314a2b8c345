"""``specdec check``: print the support matrix, or validate a configuration and explain it."""
from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specdec_cli.cli.output import console, print_effective
from specdec_cli.config.compose import compose_config
from specdec_cli.config.matrix import FEATURES, support
from specdec_cli.config.methods import method_names
from specdec_cli.config.validate import resolve
from specdec_cli.errors import ConfigError

# short column headers (explained by LEGEND); messages use matrix.FEATURES
COLUMNS = {
    "rejection_sampling": "rejection",
    "relaxed_acceptance": "relaxed",
    "dynamic_draft_length": "dyn. K",
    "draft_vocab_mapping": "d2t",
    "tensor_parallel": "TP",
    "attention_dp": "ADP",
    "context_parallel": "CP",
    "guided_decoding": "guided",
    "flashinfer_backend": "flashinfer",
    "confidence_stop": "conf. stop",
    "suffix_enhancer": "enhancer",
    "adaptive_skip": "skip",
    "draft_tree": "tree",
}
LEGEND = (
    "dyn. K: dynamic draft length; d2t: draft vocabulary mapping; "
    "TP/ADP/CP: tensor / attention-data / context parallelism; conf. stop: method.draft_confidence; "
    "enhancer: method.suffix_enhancer; skip: method.adaptive_min_accept"
)


def check(
    overrides: Annotated[
        Optional[list[str]], typer.Argument(help="Hydra overrides, e.g. method=ngram rejection=on")
    ] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the support matrix as a Markdown table.")
    ] = False,
) -> None:
    """Print the support matrix; with overrides, validate that run and show what it will do.

    Exit code 2 lists every rule the configuration breaks, one per line.
    """
    flags = [item for item in overrides or [] if item.startswith("-")]
    if flags:  # click would print a usage box for them
        raise ConfigError([f"specdec check takes overrides, not {flag}: it checks one configuration "
                           "(sweeps with -m are for specdec run)" for flag in flags])
    if overrides and markdown:
        raise typer.BadParameter("--markdown prints the matrix and takes no overrides")
    if markdown:
        console.print(matrix_markdown(), soft_wrap=True, markup=False, highlight=False)
    elif overrides:
        cfg = compose_config(overrides)
        print_effective(cfg, resolve(cfg))
    else:
        _print_matrix()


def _matrix_cells() -> tuple[list[list[str]], list[str]]:
    """Rows of ✓/✗ cells (a number points at a note) and the numbered notes."""
    notes: list[str] = []
    rows = []
    for method in method_names():
        row = [method]
        for feature in FEATURES:
            cell = support(method, feature)
            mark = "✓" if cell.supported else "✗"
            if cell.reason:
                if cell.reason not in notes:
                    notes.append(cell.reason)
                mark = f"{mark} {notes.index(cell.reason) + 1}"
            row.append(mark)
        rows.append(row)
    return rows, notes


def _print_matrix() -> None:
    rows, notes = _matrix_cells()
    table = Table(
        title="support matrix (method × feature)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=0,
    )
    table.add_column("method", no_wrap=True)
    for feature in FEATURES:
        table.add_column(COLUMNS[feature], justify="center", no_wrap=True)
    for method, *cells in rows:
        table.add_row(method, *(Text(c, style="green" if c[0] == "✓" else "red") for c in cells))
    Console(width=max(console.width, 132)).print(table)  # 14 columns: never squeeze the method names away
    for line in [LEGEND] + [f"{number}. {note}" for number, note in enumerate(notes, start=1)]:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print("Explain one combination: specdec check method=ngram rejection=on", markup=False)


def matrix_markdown() -> str:
    """The support matrix as the Markdown table the README carries."""
    rows, notes = _matrix_cells()
    lines = [
        "| method | " + " | ".join(COLUMNS[f] for f in FEATURES) + " |",
        "|---" * (len(FEATURES) + 1) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", LEGEND, ""] + [f"{number}. {note}" for number, note in enumerate(notes, start=1)]
    return "\n".join(lines)
