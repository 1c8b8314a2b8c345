"""Concurrency over loopback: 64 streaming clients share batches and none is lost; a fault fails only
the requests it touches and the server keeps serving."""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from specdec_cli.serve.loop import EngineLoop

CLIENTS = 64


@pytest.fixture(scope="module")
def overrides(tiny_model_dir: Path) -> list[str]:
    return [f"model.path={tiny_model_dir}", "method=ngram", "engine.max_batch_size=32"]


async def stream_one(http: httpx.AsyncClient, index: int) -> tuple[str, str, bool]:
    """(text, finish reason, saw [DONE]) of one streaming completion."""
    body = {"prompt": f"Count with me: {index}, {index + 1},", "max_tokens": 4 + index % 4, "stream": True,
            "temperature": 0.8 if index % 2 else 0.0, "seed": index}
    text, finish, done = "", "", False
    async with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                choice = json.loads(line[6:])["choices"][0]
                text += choice["text"]
                finish = choice["finish_reason"] or finish
    return text, finish, done


async def many_streams(base_url: str, count: int) -> list[tuple[str, str, bool]]:
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits, trust_env=False) as http:
        return await asyncio.gather(*(stream_one(http, i) for i in range(count)))


def test_64_concurrent_streaming_clients_share_batches_and_none_is_lost(served, base_url) -> None:
    stats = served[1].pipeline.engine.stats
    steps_before, forwards_before = stats.verify_steps, stats.target_forwards
    start = time.perf_counter()
    results = asyncio.run(many_streams(base_url, CLIENTS))
    elapsed = time.perf_counter() - start
    assert len(results) == CLIENTS and all(done and finish == "length" for _, finish, done in results)
    assert elapsed < 60
    stats = served[1].pipeline.engine.stats
    # continuous batching: many requests' verify steps per target forward
    assert (stats.verify_steps - steps_before) > 4 * (stats.target_forwards - forwards_before)
    metrics = httpx.get(f"{base_url}/metrics", trust_env=False).text
    assert f'specdec_requests_total{{finish_reason="length"}} {CLIENTS}' in metrics


def test_a_fault_in_one_request_fails_only_that_request(served, client, monkeypatch) -> None:
    text_of = EngineLoop._text

    def poisoned(self, request, done):
        if "POISON" in request.prompt:
            raise RuntimeError("poisoned detokenisation")
        return text_of(self, request, done)

    monkeypatch.setattr(EngineLoop, "_text", poisoned)

    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=client.base_url, timeout=60, trust_env=False) as http:
            return await asyncio.gather(*(http.post("/v1/completions", json={"prompt": p, "max_tokens": 6})
                                          for p in ("POISON pill", "A healthy prompt")))

    bad, good = asyncio.run(both())
    assert bad.status_code == 500 and "poisoned detokenisation" in bad.json()["error"]["message"]
    assert good.status_code == 200 and good.json()["choices"][0]["finish_reason"] == "length"


def failures(client: httpx.Client) -> float:
    (line,) = [l for l in client.get("/metrics").text.splitlines() if l.startswith("specdec_request_failures_total")]
    return float(line.split()[1])


def test_a_failed_engine_step_fails_its_batch_and_the_engine_is_rebuilt(served, client, monkeypatch) -> None:
    llm = served[1]
    broken = llm.pipeline.engine
    before = failures(client)

    def explode(*args, **kwargs):
        raise RuntimeError("injected target failure")

    monkeypatch.setattr(broken.target, "forward", explode)  # the old target only: the rebuild loads a new one
    failed = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 4})
    assert failed.status_code == 500 and "injected target failure" in failed.json()["error"]["message"]
    again = client.post("/v1/completions", json={"prompt": "still there?", "max_tokens": 3})
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 3
    assert llm.pipeline.engine is not broken  # rebuilt (the loop thread served nothing before it was)
    assert client.get("/health").json() == {"status": "ok"} and failures(client) == before + 1
