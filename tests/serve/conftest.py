"""A real server on loopback: uvicorn in a thread on a free port, serving a tiny random checkpoint."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import pytest

from specdec_cli.api import LLM
from specdec_cli.serve.server import Server


@pytest.fixture(scope="module")
def overrides(tiny_model_dir: Path) -> list[str]:
    return [f"model.path={tiny_model_dir}", "method=ngram", "engine.max_batch_size=16"]


@pytest.fixture(scope="module")
def served(overrides: list[str]) -> Iterator[tuple[Server, LLM]]:
    llm = LLM(overrides)
    server = Server(llm, "127.0.0.1", 0).start()
    yield server, llm
    server.stop()


@pytest.fixture(scope="module")
def base_url(served) -> str:
    return f"http://127.0.0.1:{served[0].port}"


@pytest.fixture
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=60, trust_env=False) as http:  # loopback: no proxies
        yield http
