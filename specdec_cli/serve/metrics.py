"""The server's Prometheus metrics (text exposition format 0.0.4), written by hand: no client library.

The engine thread records (``observe_step``, ``observe_finished``, ``observe_failure``) under a lock; an
HTTP handler renders (``render``). Speculation gauges come from the engine's ``SpecStats``; latency
histograms from each finished request (``Request.ttft_s``, ``itl_s``, ``tpot_s``).
"""
from __future__ import annotations

import bisect
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from specdec_cli.engine.metrics import SpecStats
from specdec_cli.engine.request import Request

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RATE_WINDOW_S = 10.0  # tokens/s is measured over this trailing window


@dataclass
class Histogram:
    """A cumulative Prometheus histogram over fixed ``buckets`` (upper bounds, seconds)."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; last: > every bound
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    def lines(self, name: str) -> list[str]:
        """``<name>_bucket{le=...}`` (cumulative), ``_sum`` and ``_count``."""
        out, running = [], 0
        for bound, count in zip((*map(_number, self.buckets), "+Inf"), self.counts):
            running += count
            out.append(f'{name}_bucket{{le="{bound}"}} {running}')
        return out + [f"{name}_sum {_number(self.total)}", f"{name}_count {running}"]


@dataclass
class EngineSnapshot:
    """What the engine thread copies out of the engine after each step (read by ``render``)."""

    acceptance_length: float = 0.0
    per_position: list[float] = field(default_factory=list)
    accepted_per_step: list[int] = field(default_factory=list)
    waiting: int = 0
    running: int = 0


class ServerMetrics:
    """Counters, gauges and histograms of one server; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.snapshot = EngineSnapshot()
        self.finished: Counter[str] = Counter()  # finish reason -> requests
        self.failures = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.recent: deque[tuple[float, int]] = deque()  # (time, tokens emitted) per step in the window
        self.ttft, self.itl, self.tpot, self.e2e = Histogram(), Histogram(), Histogram(), Histogram()

    def observe_step(self, stats: SpecStats, tokens: int, waiting: int, running: int) -> None:
        """After one engine step: ``tokens`` emitted in it; ``waiting`` / ``running`` requests."""
        now = time.monotonic()
        snapshot = EngineSnapshot(
            acceptance_length=stats.emitted_tokens / stats.verify_steps if stats.verify_steps else 0.0,
            per_position=[a / p for a, p in zip(stats.accepted_at, stats.proposed_at)],
            accepted_per_step=list(stats.accepted_per_step), waiting=waiting, running=running)
        with self._lock:
            self.snapshot = snapshot
            self.recent.append((now, tokens))
            self.generation_tokens += tokens
            while self.recent and self.recent[0][0] < now - RATE_WINDOW_S:
                self.recent.popleft()

    def observe_queue(self, waiting: int, running: int) -> None:
        with self._lock:
            self.snapshot.waiting, self.snapshot.running = waiting, running

    def observe_finished(self, request: Request, finish_reason: str) -> None:
        with self._lock:
            self.finished[finish_reason] += 1
            self.prompt_tokens += len(request.prompt_token_ids)
            self.ttft.observe(request.ttft_s)
            self.e2e.observe(request.finish_s - request.arrival_s)
            if request.tpot_s is not None:
                self.tpot.observe(request.tpot_s)
            for gap in request.itl_s:
                self.itl.observe(gap)

    def observe_failure(self, count: int = 1) -> None:
        with self._lock:
            self.failures += count

    def tokens_per_s(self) -> float:
        """Tokens emitted per second over the trailing window (0 when idle)."""
        now = time.monotonic()
        with self._lock:
            return sum(t for at, t in self.recent if at >= now - RATE_WINDOW_S) / RATE_WINDOW_S

    def render(self) -> str:
        """The whole exposition, ending in a newline."""
        rate = self.tokens_per_s()
        with self._lock:
            s = self.snapshot
            families = [
                ("acceptance_length", "gauge", "Mean tokens emitted per verify step (bonus token included).",
                 [f"specdec_acceptance_length {_number(s.acceptance_length)}"]),
                ("per_position_acceptance", "gauge", "P(draft at position i accepted | proposed).",
                 [f'specdec_per_position_acceptance{{position="{i + 1}"}} {_number(v)}'
                  for i, v in enumerate(s.per_position)]),
                ("verify_steps_total", "counter", "Verify steps per request by the number of drafts they accepted.",
                 [f'specdec_verify_steps_total{{accepted="{i}"}} {n}' for i, n in enumerate(s.accepted_per_step)]),
                ("tokens_per_second", "gauge", f"Output tokens per second over the last {RATE_WINDOW_S:g} s.",
                 [f"specdec_tokens_per_second {_number(rate)}"]),
                ("queue_depth", "gauge", "Requests waiting for a batch slot.", [f"specdec_queue_depth {s.waiting}"]),
                ("running_requests", "gauge", "Requests in the running batch.",
                 [f"specdec_running_requests {s.running}"]),
                ("requests_total", "counter", "Finished requests by finish reason.",
                 [f'specdec_requests_total{{finish_reason="{r}"}} {n}' for r, n in sorted(self.finished.items())]),
                ("request_failures_total", "counter", "Requests that failed inside the server.",
                 [f"specdec_request_failures_total {self.failures}"]),
                ("prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
                 [f"specdec_prompt_tokens_total {self.prompt_tokens}"]),
                ("generation_tokens_total", "counter", "Output tokens emitted.",
                 [f"specdec_generation_tokens_total {self.generation_tokens}"]),
                ("time_to_first_token_seconds", "histogram", "Arrival to first token.",
                 self.ttft.lines("specdec_time_to_first_token_seconds")),
                ("inter_token_latency_seconds", "histogram", "Gap between output tokens (per token).",
                 self.itl.lines("specdec_inter_token_latency_seconds")),
                ("time_per_output_token_seconds", "histogram", "Per output token after the first, per request.",
                 self.tpot.lines("specdec_time_per_output_token_seconds")),
                ("e2e_request_latency_seconds", "histogram", "Arrival to finish.",
                 self.e2e.lines("specdec_e2e_request_latency_seconds")),
            ]
        out = []
        for name, kind, help_text, samples in families:
            out += [f"# HELP specdec_{name} {help_text}", f"# TYPE specdec_{name} {kind}", *samples]
        return "\n".join(out) + "\n"


def _number(value: float) -> str:
    return repr(float(value))
