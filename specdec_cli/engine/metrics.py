"""Speculation statistics, defined once.

- ``acceptance_length``: mean tokens emitted per verify step per request, *including* the
  bonus/recovered token (1.0 = speculation bought nothing; at most K+1).
- ``acceptance_rate``: accepted drafts / proposed drafts.
- ``per_position_acceptance[i]``: P(draft i+1 accepted | it was proposed).
- ``accepted_per_step[i]``: verify steps (per request) that accepted exactly i drafts (a histogram).
- ``time_breakdown_s``: seconds summed over the run's steps in the target forward (verify + prefill),
  drafting and acceptance; ``other`` = the steps' wall time minus those three (scheduling, buffers, Python).
- ``profile=true``: ``steps`` holds each step's {target_forward, draft, accept, other} seconds, batch size,
  drafts proposed and tokens emitted, and each phase is a ``specdec.<phase>`` range in the torch.profiler trace.
- ``ttft_s`` / ``tpot_s`` / ``itl_s``: latency {mean, p50, p95, p99} over finished requests (ITL: over
  emitted tokens); see ``Request`` for the definitions.
"""
from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Optional

from torch.profiler import record_function

if TYPE_CHECKING:
    from specdec_cli.engine.request import Request

PHASES = ("target_forward", "draft", "accept")
PER_PROCESS = {"per_process": True}  # SpecStats fields that ranks do not merge


@dataclass
class Latency:
    """Latency samples of finished requests; ``+`` concatenates (ranks merge their shares)."""

    ttft_s: list[float] = field(default_factory=list)  # one per request
    tpot_s: list[float] = field(default_factory=list)  # one per request with >= 2 output tokens
    itl_s: list[float] = field(default_factory=list)  # one per emitted token after the first

    def __add__(self, other: "Latency") -> "Latency":
        return Latency(self.ttft_s + other.ttft_s, self.tpot_s + other.tpot_s, self.itl_s + other.itl_s)


@dataclass
class SpecStats:
    verify_steps: int = 0  # (request, step) pairs in the generation phase
    emitted_tokens: int = 0  # tokens emitted by those verify steps (before stop truncation)
    proposed_drafts: int = 0
    accepted_drafts: int = 0
    proposed_at: list[int] = field(default_factory=list)  # per draft position
    accepted_at: list[int] = field(default_factory=list)
    accepted_per_step: list[int] = field(default_factory=list)  # [i]: verify steps that accepted i drafts
    target_forwards: int = 0
    draft_forwards: int = 0
    guard_fallbacks: int = 0  # steps where the proposal guard forced strict acceptance
    generated_tokens: int = 0  # tokens in the final outputs
    wall_s: float = 0.0
    step_s: float = 0.0  # wall time inside SpecEngine.step, summed
    target_forward_s: float = 0.0
    draft_s: float = 0.0
    accept_s: float = 0.0
    latency: Latency = field(default_factory=Latency)
    backend_usage: dict[str, int] = field(default_factory=dict)  # rejection groups per kernel (engine/rules.py)
    # profile=true (single process, never merged across ranks): one record per step (else None: nothing kept)
    steps: Optional[list[dict]] = field(default=None, metadata=PER_PROCESS)
    _totals_before: dict[str, float] = field(default_factory=dict, repr=False, metadata=PER_PROCESS)

    def observe(self, num_drafts: int, num_emitted: int) -> None:
        """One request's verify step: ``num_drafts`` proposed, ``num_emitted`` tokens out."""
        accepted = num_emitted - 1
        self.verify_steps += 1
        self.emitted_tokens += num_emitted
        self.proposed_drafts += num_drafts
        self.accepted_drafts += accepted
        while len(self.proposed_at) < num_drafts:
            self.proposed_at.append(0)
            self.accepted_at.append(0)
        for position in range(num_drafts):
            self.proposed_at[position] += 1
            self.accepted_at[position] += position < accepted
        self.accepted_per_step.extend([0] * (accepted + 1 - len(self.accepted_per_step)))
        self.accepted_per_step[accepted] += 1

    def finished(self, request: "Request") -> None:
        """A request finished: count its output and keep its latency samples."""
        self.generated_tokens += len(request.output_token_ids)
        self.latency.ttft_s.append(request.ttft_s)
        if request.tpot_s is not None:
            self.latency.tpot_s.append(request.tpot_s)
        self.latency.itl_s.extend(request.itl_s)

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the wall time of the block to ``<phase>_s`` (host clock: on CUDA, synchronise before reading it)."""
        start = time.perf_counter()
        try:
            with record_function(f"specdec.{phase}") if self.steps is not None else nullcontext():
                yield
        finally:
            setattr(self, f"{phase}_s", getattr(self, f"{phase}_s") + time.perf_counter() - start)

    def end_step(self, started: float, batch_size: int) -> None:
        """Close the step begun at ``started`` (perf_counter): add its wall time; when profiling, keep its record."""
        seconds = time.perf_counter() - started
        self.step_s += seconds
        if self.steps is None:
            return
        totals = {**{p: getattr(self, f"{p}_s") for p in PHASES},
                  "drafts": self.proposed_drafts, "emitted": self.emitted_tokens}
        record = {name: value - self._totals_before.get(name, 0) for name, value in totals.items()}
        record["other"] = max(0.0, seconds - sum(record[p] for p in PHASES))
        self.steps.append({"step": len(self.steps), "batch": batch_size, **record})
        self._totals_before = totals

    def time_breakdown(self) -> dict[str, float]:
        """{target_forward, draft, accept, other} seconds; they sum to ``step_s``."""
        phases = {phase: getattr(self, f"{phase}_s") for phase in PHASES}
        return {**phases, "other": max(0.0, self.step_s - sum(phases.values()))}

    def summary(self) -> dict:
        return {
            "acceptance_length": self.emitted_tokens / self.verify_steps if self.verify_steps else 0.0,
            "acceptance_rate": self.accepted_drafts / self.proposed_drafts if self.proposed_drafts else 0.0,
            "per_position_acceptance": [a / p for a, p in zip(self.accepted_at, self.proposed_at)],
            "accepted_per_step": list(self.accepted_per_step),
            "proposed_drafts": self.proposed_drafts,
            "accepted_drafts": self.accepted_drafts,
            "verify_steps": self.verify_steps,
            "generated_tokens": self.generated_tokens,
            "target_forwards": self.target_forwards,
            "guard_fallbacks": self.guard_fallbacks,
            "backend_usage": dict(self.backend_usage),
            "wall_s": self.wall_s,
            "tokens_per_s": self.generated_tokens / self.wall_s if self.wall_s else 0.0,
            "time_breakdown_s": self.time_breakdown(),
            "ttft_s": distribution(self.latency.ttft_s),
            "tpot_s": distribution(self.latency.tpot_s),
            "itl_s": distribution(self.latency.itl_s),
        }


def distribution(values: list[float]) -> dict[str, float]:
    """{mean, p50, p95, p99} of ``values`` (percentiles by linear interpolation; all 0.0 when empty)."""
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0}
    ordered = sorted(values)
    return {"mean": sum(ordered) / len(ordered), **{f"p{q}": _percentile(ordered, q) for q in (50, 95, 99)}}


def _percentile(ordered: list[float], q: int) -> float:
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
