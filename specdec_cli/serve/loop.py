"""One thread steps the engine; HTTP handlers hand it requests and receive text as it is generated.

``EngineLoop.submit(requests, sink)`` queues engine requests; the loop thread adds them to the engine
between steps (so concurrent HTTP requests share batches through its continuous batching) and, after
every step, calls ``sink(Event)`` for each request that gained text or finished. ``sink`` runs on the
loop thread and must not block (the app hands events to asyncio with ``call_soon_threadsafe``).

Text is streamed as it becomes final: the newest characters are held back while they could still
start a stop string, or end in an incomplete UTF-8 sequence (decoded as U+FFFD).

Faults: an exception while turning one request's tokens into text fails that request only. An
exception inside an engine step fails the requests of that batch (the engine's state is unknown
after it), then the engine is rebuilt (``LLM.rebuild_engine``) and the waiting requests carry on.
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from specdec_cli.api.llm import LLM
from specdec_cli.api.outputs import FINISH_REASONS, final_text
from specdec_cli.engine.request import Request
from specdec_cli.serve.metrics import ServerMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """News about one request: ``text`` new since the last event; ``done``: it finished (``error``: failed)."""

    request: Request
    text: str = ""
    done: bool = False
    error: Optional[str] = None


Sink = Callable[[Event], None]


@dataclass
class _Tracked:
    sink: Sink
    sent: int = 0  # characters of text already sent
    tokens: int = 0  # output tokens already counted


class EngineLoop:
    """The engine's only driver while the server runs (see the module docstring)."""

    def __init__(self, llm: LLM, metrics: ServerMetrics) -> None:
        self.llm, self.metrics = llm, metrics
        self._inbox: queue.SimpleQueue[Optional[tuple[list[Request], Sink]]] = queue.SimpleQueue()
        self._tracked: dict[int, _Tracked] = {}  # id(request) -> its sink and progress
        self._thread = threading.Thread(target=self._run, name="specdec-engine", daemon=True)
        self._stopping = threading.Event()
        self.tokenizer_lock = threading.Lock()  # held while decoding here and while handlers encode

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._inbox.put(None)
        self._thread.join(timeout=30)

    def submit(self, requests: list[Request], sink: Sink) -> None:
        """Queue ``requests``; ``sink`` receives their events (thread-safe)."""
        self._inbox.put((requests, sink))

    # ------------------------------------------------------------------ the loop thread
    def _run(self) -> None:
        engine = self.llm.pipeline.engine
        while not self._stopping.is_set():
            self._admit(block=not engine.has_work())
            engine = self.llm.pipeline.engine
            if not engine.has_work():
                continue
            try:
                finished = engine.step()
                self._publish(engine.active, finished)  # a fault here leaves the engine unknown as well
            except Exception as err:  # noqa: BLE001 - the server outlives a failed step
                log.exception("engine step failed; failing its batch and rebuilding the engine")
                self._fail_batch(f"internal error in an engine step: {type(err).__name__}: {err}")

    def _admit(self, *, block: bool) -> None:
        """Move submitted requests into the engine (waiting for one when ``block``)."""
        engine = self.llm.pipeline.engine
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            while item is not None:
                requests, sink = item
                for request in requests:
                    self._add(request, sink)
                item = self._inbox.get_nowait()
        except queue.Empty:
            pass
        self.metrics.observe_queue(len(engine.waiting), len(engine.active))

    def _add(self, request: Request, sink: Sink) -> None:
        try:
            self.llm.pipeline.engine.add_request(request)
        except ValueError as err:  # checked before submission; a request the engine still refuses fails alone
            self.metrics.observe_failure()
            sink(Event(request, done=True, error=str(err)))
            return
        self._tracked[id(request)] = _Tracked(sink)

    def _publish(self, running: list[Request], finished: list[Request]) -> None:
        """Send each request's new text; finish the finished ones; record the step's metrics."""
        emitted = 0
        for request in [*running, *finished]:
            tracked = self._tracked.get(id(request))
            if tracked is None:
                continue
            emitted += len(request.output_token_ids) - tracked.tokens
            tracked.tokens = len(request.output_token_ids)
            done = request.finish_reason is not None
            try:
                with self.tokenizer_lock:
                    text = self._text(request, done)
            except Exception as err:  # noqa: BLE001 - this request fails, the others go on
                log.exception("request %s failed while decoding", request.id)
                self._untrack(request, Event(request, done=True, error=f"{type(err).__name__}: {err}"))
                continue
            if done:
                self.metrics.observe_finished(request, FINISH_REASONS.get(request.finish_reason or "", "length"))
                self._untrack(request, Event(request, text[tracked.sent:], done=True))
            elif len(text) > tracked.sent:
                tracked.sink(Event(request, text[tracked.sent:]))
                tracked.sent = len(text)
        engine = self.llm.pipeline.engine
        self.metrics.observe_step(engine.stats, emitted, len(engine.waiting), len(engine.active))

    def _text(self, request: Request, done: bool) -> str:
        """The request's text so far: all of it when done, else without a possibly unfinished tail."""
        if done:
            return final_text(request, self.llm.decode)
        text = self.llm.decode(request.output_token_ids)
        hold = max((len(stop) - 1 for stop in request.stop), default=0)
        text = text[: len(text) - hold] if hold else text
        return text.rstrip("\ufffd")

    def _untrack(self, request: Request, event: Event) -> None:
        tracked = self._tracked.pop(id(request), None)
        if event.error is not None:
            self.metrics.observe_failure()
        if tracked is not None:
            tracked.sink(event)

    def _fail_batch(self, message: str) -> None:
        """Fail the running requests of a broken engine, rebuild it, and re-queue the waiting ones."""
        broken = self.llm.pipeline.engine
        for request in list(broken.active):
            self._untrack(request, Event(request, done=True, error=message))
        waiting = list(broken.waiting)
        self.llm.rebuild_engine()
        for request in waiting:
            tracked = self._tracked.pop(id(request), None)
            if tracked is not None:
                self._add(request, tracked.sink)
