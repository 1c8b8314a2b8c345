"""Driving an engine: to completion (feed it requests, step until every one has finished), and its warm-up."""
from __future__ import annotations

import time
from typing import Callable, Optional

from specdec_cli.engine.engine import SpecEngine
from specdec_cli.engine.request import Request, SamplingParams


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


def warm_up(engine: SpecEngine, prompt_ids: list[int]) -> None:
    """Pay the one-time costs (packed weights, row kernels, JIT compiles of the drafter and the sampling kernels)
    before anything is timed: a greedy and a seeded T=1 throw-away request from ``prompt_ids`` run full speculative
    steps, then the engine starts afresh (``SpecEngine.reset``) and the drafter forgets them. The engine must be idle."""
    if engine.has_work():
        raise RuntimeError("warm_up needs an idle engine")
    options = engine.options
    prompt_ids = list(prompt_ids)[: max(1, options.max_seq_len // 2)]
    new_tokens = min(3 * (options.max_draft_len + 1) + 1, options.max_seq_len - len(prompt_ids))
    if new_tokens < 1:
        return
    run_to_completion(engine, [Request(f"warm-up-{name}", prompt_ids, params, max_new_tokens=new_tokens)
                               for name, params in (("greedy", SamplingParams()),
                                                    ("sampled", SamplingParams(temperature=1.0, seed=0)))])
    if engine.drafter is not None:
        engine.drafter.forget_finished()
    engine.reset()
