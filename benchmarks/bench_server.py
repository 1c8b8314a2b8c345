"""``specdec serve`` under load, over loopback: throughput, latency and lost requests per method.

Usage: .venv/bin/python benchmarks/bench_server.py [--methods none,ngram] [--requests 256] [--concurrency 128]
           [--max-tokens 64] [--batch 32] [--time-limit 600] [--out benchmarks/results_server.md]
           [-- extra overrides, e.g. model.path=... engine.max_seq_len=2048]

Protocol: for each method a server is started in this process (uvicorn in a thread on 127.0.0.1, a
free port; nothing leaves the machine) and ``--requests`` streaming chat completions (MT-Bench first
turns, cycled; every other request at temperature 0.8 with a seed, the rest greedy) are sent by
``--concurrency`` concurrent clients. New requests stop being issued after ``--time-limit`` seconds.
A request is lost when its stream ends without ``data: [DONE]`` or a finish reason; failed when the
server answers an error. Client-side TTFT (send -> first content) and TPOT ((end - first content) /
(tokens - 1)); throughput = completion tokens (from ``usage``) / wall time. The speed-up column is
tokens/s over the first method's (run it with ``none`` first), from the same invocation.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch

from specdec_cli.api import LLM
from specdec_cli.config.schema import WorkloadConfig
from specdec_cli.engine.workload import read_workload
from specdec_cli.serve.server import Server


@dataclass
class Outcome:
    status: str  # ok | failed | lost
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    tokens: int = 0
    acceptance_length: float = 0.0


@dataclass
class MethodResult:
    method: str
    wall_s: float
    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    @property
    def tokens_per_s(self) -> float:
        return sum(o.tokens for o in self.outcomes) / self.wall_s if self.wall_s else 0.0


async def one_request(http: httpx.AsyncClient, prompt: str, index: int, max_tokens: int) -> Outcome:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.8 if index % 2 else 0.0, "seed": index}
    sent = time.perf_counter()
    first = end = 0.0
    finish, done, usage = None, False, {}
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return Outcome("failed")
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return Outcome("failed")
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", []):
                    if choice["delta"].get("content") and not first:
                        first = time.perf_counter()
                    finish = choice.get("finish_reason") or finish
            end = time.perf_counter()
    except httpx.HTTPError:
        return Outcome("lost")
    tokens = int(usage.get("completion_tokens", 0))
    if not done or finish is None:
        return Outcome("lost")
    first = first or end
    return Outcome("ok", first - sent, (end - first) / (tokens - 1) if tokens > 1 else 0.0, tokens,
                   float(usage.get("acceptance_length", 0.0)))


async def load(base_url: str, prompts: list[str], args: argparse.Namespace) -> tuple[list[Outcome], float]:
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    gate = asyncio.Semaphore(args.concurrency)
    deadline = time.perf_counter() + args.time_limit

    async def gated(http: httpx.AsyncClient, index: int) -> Outcome | None:
        async with gate:
            if time.perf_counter() > deadline:
                return None  # not issued: the time limit passed
            return await one_request(http, prompts[index % len(prompts)], index, args.max_tokens)

    start = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, timeout=args.time_limit, limits=limits, trust_env=False) as http:
        results = await asyncio.gather(*(gated(http, i) for i in range(args.requests)))
    return [r for r in results if r is not None], time.perf_counter() - start


def run_method(method: str, prompts: list[str], args: argparse.Namespace) -> MethodResult:
    overrides = [f"method={method}", f"engine.max_batch_size={args.batch}", *args.overrides]
    server = Server(LLM(overrides), "127.0.0.1", 0).start()
    try:
        outcomes, wall_s = asyncio.run(load(f"http://127.0.0.1:{server.port}", prompts, args))
    finally:
        server.stop()
    return MethodResult(method, wall_s, outcomes)


def quantile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def table(results: list[MethodResult], args: argparse.Namespace) -> str:
    head = ("| method | ok | failed | lost | tokens/s | speed-up | acc. length | TTFT p50 / p95 ms | "
            "TPOT p50 / p95 ms |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    base = results[0].tokens_per_s
    for r in results:
        ok = [o for o in r.outcomes if o.status == "ok"]
        ttft, tpot = [o.ttft_s * 1e3 for o in ok], [o.tpot_s * 1e3 for o in ok]
        acceptance = statistics.fmean(o.acceptance_length for o in ok) if ok else 0.0
        lines.append(f"| {r.method} | {len(ok)} | {r.count('failed')} | {r.count('lost')} | {r.tokens_per_s:.1f} | "
                     f"{r.tokens_per_s / base if base else 0:.2f}× | {acceptance:.2f} | "
                     f"{quantile(ttft, .5):.0f} / {quantile(ttft, .95):.0f} | "
                     f"{quantile(tpot, .5):.1f} / {quantile(tpot, .95):.1f} |")
    command = " ".join(["python", "benchmarks/bench_server.py", *sys.argv[1:]])
    return (f"# specdec serve under load\n\n`{command}`\n\n{args.requests} streaming chat requests, "
            f"{args.concurrency} concurrent clients, max_tokens={args.max_tokens}, engine.max_batch_size="
            f"{args.batch}, loopback.\nMachine: {platform.machine()}, {os.cpu_count()} vCPUs, torch {torch.__version__}, "
            f"{time.strftime('%Y-%m-%d')}.\n\n" + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="none,ngram")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per method before no new requests")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results_server.md"))
    parser.add_argument("overrides", nargs="*", help="extra specdec overrides (after --)")
    args = parser.parse_args()
    rows = read_workload(WorkloadConfig(name="mt_bench", source="mt_bench", num_prompts=0))
    prompts = [row.text for row in rows]
    results = [run_method(method, prompts, args) for method in args.methods.split(",")]
    report = table(results, args)
    args.out.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
