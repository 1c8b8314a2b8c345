"""Driving an engine: feed it requests and step it until every one has finished."""
from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specdec_cli.engine.drive import run_to_completion
from specdec_cli.engine.engine import SpecEngine
from specdec_cli.engine.request import Request
from specdec_cli.errors import ConfigError


def run_requests(engine: SpecEngine, requests: list[Request], *, show_progress: bool = False) -> list[Request]:
    """Feed ``requests`` through ``engine`` until all finish, with a progress bar; returns them in input order."""
    with Progress(TextColumn("[bold]generating"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                  TimeElapsedColumn(), transient=True, disable=not show_progress) as progress:
        task = progress.add_task("run", total=len(requests))
        return run_to_completion(engine, requests, lambda finished: progress.advance(task, len(finished)))


def generate_outputs(engine: SpecEngine, requests: list[Request], tokenizer, *, show_progress: bool) -> None:
    """Run ``requests`` to completion and decode their text; unfit requests are input errors."""
    try:
        run_requests(engine, requests, show_progress=show_progress)
    except ValueError as err:  # a request that cannot fit, an empty prompt
        raise ConfigError([str(err)]) from None
    for request in requests:
        if not request.output_text:
            request.output_text = tokenizer.decode(request.output_token_ids, skip_special_tokens=True)
