"""The OpenAI-compatible HTTP API on FastAPI: /v1/models, /v1/completions, /v1/chat/completions
(``stream=true``: server-sent events ending in ``data: [DONE]``), /health and /metrics.

Handlers validate and tokenise, then hand engine requests to the ``EngineLoop`` thread and await
their events on an asyncio queue; they never touch the engine. Errors are OpenAI-style JSON: 400 for
a bad body or value, 404 for another model's name, 500 for a request that failed inside the server.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, AsyncIterator, Union

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from specdec_cli.api.llm import LLM
from specdec_cli.api.params import messages_problems
from specdec_cli.engine.request import Request
from specdec_cli.engine.workload import WorkloadRow
from specdec_cli.errors import ConfigError
from specdec_cli.serve.loop import EngineLoop, Event, Sink
from specdec_cli.serve.metrics import ServerMetrics
from specdec_cli.serve.protocol import ChatBody, CompletionBody, ResponseShape, error_body, finish_reason

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def create_app(llm: LLM) -> FastAPI:
    """The app serving ``llm``; its lifespan starts and stops the engine thread."""
    metrics = ServerMetrics()
    engine_loop = EngineLoop(llm, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine_loop.start()
        yield
        engine_loop.stop()

    app = FastAPI(title="specdec", lifespan=lifespan)
    app.state.engine_loop = engine_loop

    @app.exception_handler(RequestValidationError)
    async def bad_body(_, err: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(describe_validation(err)), status_code=400)

    @app.get("/health")
    def health() -> JSONResponse:
        if engine_loop.alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse(error_body("the engine thread has stopped", "server_error"), status_code=503)

    @app.get("/metrics")
    def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type=PROMETHEUS_TEXT)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": llm.model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "specdec"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody) -> Any:
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        problems = [f"prompt[{i}] must be a non-empty string" for i, p in enumerate(prompts) if not p.strip()]
        problems += [] if prompts else ["prompt must be a string or a non-empty list of strings"]
        rows = [WorkloadRow(id="", text=p, overrides={}) for p in prompts]
        return await respond(body, rows, chat=False, problems=problems)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody) -> Any:
        messages = [m.plain() for m in body.messages]
        text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        rows = [WorkloadRow(id="", text=text, overrides={}, messages=tuple(messages))]
        return await respond(body, rows, chat=True, problems=messages_problems(messages))

    async def respond(body: Union[CompletionBody, ChatBody], rows: list[WorkloadRow], *, chat: bool,
                      problems: list[str]) -> Any:
        if body.model is not None and body.model != llm.model_name:
            return JSONResponse(error_body(f"model {body.model!r} is not served here (this server serves "
                                           f"{llm.model_name!r})", code="model_not_found"), status_code=404)
        params = body.sampling_params()
        problems = problems + body.problems(params)
        if problems:
            return JSONResponse(error_body("; ".join(problems)), status_code=400)
        try:
            with engine_loop.tokenizer_lock:
                requests = llm.make_requests(rows, [params] * len(rows), chat=chat)
        except ConfigError as err:
            return JSONResponse(error_body("; ".join(err.violations)), status_code=400)
        events: asyncio.Queue[Event] = asyncio.Queue()
        engine_loop.submit(requests, _sink(asyncio.get_running_loop(), events))
        shape = ResponseShape(chat, llm.model_name)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_stream(shape, requests, events, include_usage), media_type="text/event-stream")
        texts = ["" for _ in requests]
        async for index, event in _events(requests, events):
            if event.error is not None:
                return JSONResponse(error_body(event.error, "server_error"), status_code=500)
            texts[index] += event.text
        return shape.whole(requests, texts)

    return app


def describe_validation(err: RequestValidationError) -> str:
    """One line per problem of a request body: ``field.path: message``."""
    lines = []
    for problem in err.errors():
        loc = problem.get("loc", ())[1:]
        if problem.get("type") == "json_invalid":
            reason = (problem.get("ctx") or {}).get("error", "JSON decode error")
            lines.append(f"the request body is not valid JSON ({reason} at character {loc[0] if loc else '?'})")
        elif not loc and problem.get("type") in ("model_attributes_type", "dict_type"):
            lines.append("the request body must be a JSON object (send Content-Type: application/json)")
        else:
            where = ".".join(str(part) for part in loc)
            lines.append(f"{where}: {problem.get('msg')}" if where else str(problem.get("msg")))
    return "; ".join(lines) or "invalid request body"


def _sink(loop: asyncio.AbstractEventLoop, events: asyncio.Queue[Event]) -> Sink:
    """Hand events from the engine thread to ``loop``; dropped once the loop has closed (shutdown)."""
    def put(event: Event) -> None:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(events.put_nowait, event)
    return put


async def _events(requests: list[Request], events: asyncio.Queue[Event]) -> AsyncIterator[tuple[int, Event]]:
    """(choice index, event) until every request is done."""
    index_of = {id(request): index for index, request in enumerate(requests)}
    remaining = len(requests)
    while remaining:
        event = await events.get()
        remaining -= event.done
        yield index_of[id(event.request)], event


def _sse(payload: Union[dict[str, Any], str]) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


async def _stream(shape: ResponseShape, requests: list[Request], events: asyncio.Queue[Event],
                  include_usage: bool) -> AsyncIterator[str]:
    """The SSE chunks of one response: text deltas, each choice's finish, usage if asked, ``[DONE]``."""
    if shape.chat:
        for index in range(len(requests)):
            yield _sse(shape.chunk(index, "", role=True))
    async for index, event in _events(requests, events):
        if event.error is not None:
            yield _sse(error_body(event.error, "server_error"))
            continue
        if event.text:
            yield _sse(shape.chunk(index, event.text))
        if event.done:
            yield _sse(shape.chunk(index, "", finish_reason(event.request)))
    if include_usage:
        yield _sse(shape.usage_chunk(requests))
    yield _sse("[DONE]")
