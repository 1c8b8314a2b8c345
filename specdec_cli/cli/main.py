"""The ``specdec`` command: wires one file per command; ``main`` is the error boundary.

Errors become ``error: ...`` lines on stderr: configuration/input problems exit 2 (one
line per violation), other failures exit 1. ``--debug`` or ``SPECDEC_DEBUG=1`` shows
tracebacks. Inside ``specdec run`` each Hydra job prints its own lines (see ``run.py``).
"""
from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from specdec_cli.cli import check, report, run, serve, train, verify
from specdec_cli.cli.completion import COMPLETE_ENV, complete
from specdec_cli.cli.output import DEBUG_ENV, debug_enabled, error_lines, print_errors

app = typer.Typer(
    name="specdec",
    help="Speculative decoding with distribution-preserving rejection sampling.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command(context_settings={"ignore_unknown_options": True})(check.check)
app.command(context_settings=run.CONTEXT_SETTINGS, options_metavar=run.METAVAR)(run.run)
app.command(context_settings=run.CONTEXT_SETTINGS, options_metavar=run.METAVAR)(train.train)
app.command()(report.report)
app.command(context_settings=run.CONTEXT_SETTINGS, options_metavar="[OVERRIDES]")(serve.serve)
app.command()(verify.verify)


@app.callback()
def _global_options(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks (same as SPECDEC_DEBUG=1).")
    ] = False,
) -> None:
    if debug:
        os.environ[DEBUG_ENV] = "1"


def main() -> None:
    """Console entry point: run the app, turn every escaping error into lines + an exit code."""
    try:
        if os.environ.get(COMPLETE_ENV):  # bash asks for completions (cli/completion.py)
            complete(app, os.environ.get("COMP_LINE", ""), int(os.environ.get("COMP_POINT") or 0) or None)
            sys.exit(0)
        app(prog_name="specdec")
    except run.JobFailed as err:  # its lines were printed by the job
        sys.exit(err.exit_code)
    except Exception as err:
        if debug_enabled():
            raise
        lines, code = error_lines(err)
        print_errors(lines)
        sys.exit(code)
