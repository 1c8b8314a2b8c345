"""Driving an engine to completion: feed it requests and step it until every one has finished."""
from __future__ import annotations

import time
from typing import Callable, Optional

from specdec_cli.engine.engine import SpecEngine
from specdec_cli.engine.request import Request


def run_to_completion(engine: SpecEngine, requests: list[Request],
                      on_step: Optional[Callable[[list[Request]], None]] = None) -> list[Request]:
    """Add ``requests``, step until none is left (``on_step`` sees each step's finished requests);
    returns them in input order and adds the loop's wall time to ``engine.stats.wall_s``."""
    for request in requests:
        engine.add_request(request)
    start = time.perf_counter()
    while engine.has_work():
        finished = engine.step()
        if on_step is not None:
            on_step(finished)
    engine.stats.wall_s += time.perf_counter() - start
    return requests
