"""``profile=true``: a per-step time breakdown and a torch.profiler trace of the generation.

Writes ``profile_steps.jsonl`` (one row per engine step: {step, batch, target_forward, draft, accept, other}
seconds, drafts proposed, tokens emitted) and ``profile_trace.json`` (Chrome trace format: open it in
Perfetto or chrome://tracing; each phase is a ``specdec.<phase>`` range) next to results.json.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.profiler import ProfilerActivity, profile

from specdec_cli.engine.engine import SpecEngine
from specdec_cli.files import atomic_write_jsonl

STEPS_FILE, TRACE_FILE = "profile_steps.jsonl", "profile_trace.json"


@contextmanager
def profiled(engine: SpecEngine, output_dir: Path, enabled: bool) -> Iterator[dict[str, Any]]:
    """Profile the engine's steps inside the block when ``enabled``; yields the dict that ends up as
    ``metrics.profile`` ({} when not enabled): the two file names and the step count."""
    summary: dict[str, Any] = {}
    if not enabled:
        yield summary
        return
    engine.stats.steps = []
    activities = [ProfilerActivity.CPU]
    if engine.target.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as profiler:
        yield summary
    if engine.target.device.type == "cuda":
        torch.cuda.synchronize(engine.target.device)
    trace = output_dir / TRACE_FILE
    profiler.export_chrome_trace(str(trace.with_suffix(".tmp")))  # then renamed: never half-written
    trace.with_suffix(".tmp").replace(trace)
    atomic_write_jsonl(output_dir / STEPS_FILE, engine.stats.steps)
    summary.update(steps=len(engine.stats.steps), steps_file=STEPS_FILE, trace_file=TRACE_FILE)
