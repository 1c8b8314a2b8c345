"""The shard format shared by corpus v1 and v2, and the plain-engine driver that fills shards.

A shard (``shard_00000.npz``) holds rows of (prompt ids, response ids) as flat uint16 arrays
with int32 lengths and a per-row ``held_out`` flag; v2 shards add per-row ``family`` (str) and
``temperature`` (float32). Shards are written atomically, so a killed run leaves none half-written.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Collection, Optional, Union

import numpy as np

from specdec_cli.engine.drive import run_to_completion
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request
from specdec_cli.files import atomic_write_bytes
from specdec_cli.models import Transformer

V1_FAMILY = "templates"  # v1 shards carry no family column: their prompts are the built-in templates


def save_shard(path: Path, prompts: list[list[int]], responses: list[list[int]], held_out: list[bool], *,
                families: Optional[list[str]] = None, temperatures: Optional[list[float]] = None) -> None:
    """One shard, written atomically (uint16 ids); v2 shards add per-row family and temperature."""
    columns = dict(
        prompt_ids=np.array([t for p in prompts for t in p], dtype=np.uint16),
        prompt_lens=np.array([len(p) for p in prompts], dtype=np.int32),
        response_ids=np.array([t for r in responses for t in r], dtype=np.uint16),
        response_lens=np.array([len(r) for r in responses], dtype=np.int32),
        held_out=np.array(held_out, dtype=bool),
    )
    if families is not None:
        columns["family"] = np.array(families, dtype=str)
    if temperatures is not None:
        columns["temperature"] = np.array(temperatures, dtype=np.float32)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **columns)
    atomic_write_bytes(path, buffer.getvalue())


def shard_families(data) -> np.ndarray:
    """Per-row family names of a loaded shard (v1 shards: all ``V1_FAMILY``)."""
    if "family" in data:
        return data["family"]
    return np.full(len(data["held_out"]), V1_FAMILY)


def load_corpus(directory: Path, *, held_out: Optional[bool] = None,
                family: Union[None, str, Collection[str]] = None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) pairs from every shard; filter by held-out membership and family."""
    families = {family} if isinstance(family, str) else None if family is None else set(family)
    pairs = []
    for path in sorted(directory.glob("shard_*.npz")):
        data = np.load(path)
        prompts = np.split(data["prompt_ids"].astype(np.int64), np.cumsum(data["prompt_lens"])[:-1])
        responses = np.split(data["response_ids"].astype(np.int64), np.cumsum(data["response_lens"])[:-1])
        for prompt, response, flag, name in zip(prompts, responses, data["held_out"], shard_families(data)):
            if (held_out is None or bool(flag) == held_out) and (families is None or str(name) in families):
                pairs.append((prompt.tolist(), response.tolist()))
    return pairs


def run_engine(target: Transformer, requests: list[Request], batch_size: int) -> None:
    """Complete ``requests`` in place with the plain engine (no drafter), ``batch_size`` at a time."""
    max_len = max(len(r.prompt_token_ids) + r.max_new_tokens for r in requests)
    engine = SpecEngine(target, None, EngineOptions(max_batch_size=batch_size, max_seq_len=max_len))
    run_to_completion(engine, requests)
