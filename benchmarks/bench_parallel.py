"""Tensor parallelism (tp1 vs tp2) and attention data parallelism (adp1 vs adp2) on the embedded default.

Usage: .venv/bin/python benchmarks/bench_parallel.py [--prompts 4] [--max-new 32] [--method none]
           [--device cpu] [--dtype float32] [--configs tp1,tp1_1thread,tp2,adp2] [--out results.md]

Every configuration goes through ``run_job`` exactly as ``specdec run`` does (parallel runs spawn
their ranks), on the same greedy workload (built-in prompts, batch = all prompts; tp1 is adp1).
tokens/s is ``metrics.tokens_per_s``: generated tokens over the engine's wall time, model loading
and rank start-up excluded (under ADP: the slowest rank's time). "end to end" is the whole call,
start-up included. "same tokens" compares the outputs with the first configuration's. Ratios come
from one run; the configurations run back to back.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

from specdec_cli.config.compose import compose_config
from specdec_cli.config.validate import resolve
from specdec_cli.run.job import run_job

CONFIGS: dict[str, tuple[str, list[str], Optional[int]]] = {  # id -> (label, overrides, cores; None: all)
    "tp1": ("tp1 = adp1 (1 process, all cores)", [], None),
    "tp1_1thread": ("tp1 = adp1 (1 process, 1 thread)", [], 1),
    "tp2": ("tp2 (2 ranks)", ["parallelism=tp2"], None),
    "adp2": ("adp2 (2 ranks)", ["parallelism=adp2"], None),
}


@contextlib.contextmanager
def cores(count: Optional[int]) -> Iterator[None]:
    """``run_job`` sets torch's threads to ``os.cpu_count()``; pretend there are ``count`` cores."""
    saved = os.cpu_count
    if count is not None:
        os.cpu_count = lambda: count
    try:
        yield
    finally:
        os.cpu_count = saved


def measure(config: str, args: argparse.Namespace, output_dir: Path) -> dict:
    _, overrides, count = CONFIGS[config]
    cfg = compose_config([
        f"method={args.method}", "sampler=greedy", f"workload.num_prompts={args.prompts}",
        f"workload.max_new_tokens={args.max_new}", f"engine.max_batch_size={args.prompts}",
        f"model.device={args.device}", f"model.dtype={args.dtype}", *overrides,
    ])
    start = time.perf_counter()
    with cores(count):
        metrics = run_job(cfg, resolve(cfg), output_dir, show_progress=False).metrics
    lines = (output_dir / "outputs.jsonl").read_text().splitlines()
    return {"tokens_per_s": metrics["tokens_per_s"], "tokens": metrics["generated_tokens"],
            "wall_s": metrics["wall_s"], "end_to_end_s": time.perf_counter() - start,
            "outputs": [json.loads(line)["output_token_ids"] for line in lines]}


def table(rows: dict[str, dict]) -> str:
    first = next(iter(rows.values()))
    lines = ["| config | tokens | engine wall (s) | tokens/s | vs first row | end to end (s) | same tokens |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for config, row in rows.items():
        ratio = row["tokens_per_s"] / first["tokens_per_s"]
        same = "yes" if row["outputs"] == first["outputs"] else "no"
        lines.append(f"| {CONFIGS[config][0]} | {row['tokens']} | {row['wall_s']:.2f} | {row['tokens_per_s']:.1f} "
                     f"| {ratio:.2f}x | {row['end_to_end_s']:.1f} | {same} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new", type=int, default=32)
    parser.add_argument("--method", default="none")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {', '.join(CONFIGS)}")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this Markdown file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specdec-bench-parallel-") as tmp:
        rows = {config: measure(config, args, Path(tmp) / config) for config in args.configs.split(",")}
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    header = (f"method={args.method}, greedy, {args.prompts} prompts x {args.max_new} new tokens, batch "
              f"{args.prompts}, device={args.device}, {args.dtype}, {os.cpu_count()} CPUs, load average {load}")
    text = f"{header}\n\n{table(rows)}\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
