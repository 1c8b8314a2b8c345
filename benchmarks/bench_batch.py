"""Batch scaling: tokens/s of ``none`` and the shipped ``eagle3`` at engine.max_batch_size 1, 4 and 16.

Usage: chrt -f 5 .venv/bin/python benchmarks/bench_batch.py [--batches 1 4 16] [--requests 16] [--max-new 32]
           [--configs none eagle3] [--temperatures 0 1] [--out benchmarks/results_batch.md]

``--requests`` requests cycle through the unseen-family prompts (benchmarks/prompts/unseen.jsonl, chat template,
seed = request index); every configuration runs all of them through one engine with continuous batching at each
batch size. Throughput = output tokens / wall time of the whole set; speed-up = over ``none`` at the same batch
size and temperature, from the same run. The target loads once (fp32, every core); every engine runs
the engine warm-up first.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from bench_unseen import build_engine, machine
from specdec_cli.engine.drive import run_to_completion, warm_up
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.workload import encode_prompt
from specdec_cli.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--configs", nargs="+", default=["none", "eagle3"])
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-new", type=int, default=32)
    parser.add_argument("--prompts", type=Path, default=Path("benchmarks/prompts/unseen.jsonl"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results_batch.md"))
    args = parser.parse_args()
    command = "python " + " ".join(sys.argv)
    target, tokenizer = load_model(None)
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    prompts = [encode_prompt(tokenizer, rows[i % len(rows)]["prompt"], chat=True) for i in range(args.requests)]
    results = []  # {temperature, batch, config, tokens_per_s, acceptance_length}
    for batch in args.batches:
        for temperature in args.temperatures:
            engines = {name: build_engine(target, tokenizer, name.split(), batch, temperature=temperature)
                       for name in args.configs}
            for engine in engines.values():  # unmeasured: first-call packing, kernel probes and compiles
                warm_up(engine, prompts[0])
            for name, engine in engines.items():
                requests = [Request(id=str(i), prompt_token_ids=ids, max_new_tokens=args.max_new,
                                    params=SamplingParams(temperature, seed=i), eos_token_ids=(tokenizer.eos_token_id,))
                            for i, ids in enumerate(prompts)]
                steps, emitted = engine.stats.verify_steps, engine.stats.emitted_tokens
                start = time.perf_counter()
                run_to_completion(engine, requests)
                seconds = time.perf_counter() - start
                tokens = sum(len(r.output_token_ids) for r in requests)
                results.append({"temperature": temperature, "batch": batch, "config": name, "tokens": tokens,
                                "seconds": seconds, "tokens_per_s": tokens / seconds,
                                "acceptance_length": (engine.stats.emitted_tokens - emitted)
                                / max(1, engine.stats.verify_steps - steps)})
                print(f"B={batch} T={temperature:g} {name}: {tokens / seconds:.1f} tokens/s", flush=True)
    write(args, command, results)


def write(args, command: str, results: list[dict]) -> None:
    base = {(r["temperature"], r["batch"]): r["tokens_per_s"] for r in results if r["config"] == "none"}
    lines = ["# Batch scaling (`benchmarks/bench_batch.py`)", "", f"Command: `{command}`  ",
             f"Machine: {machine().rsplit(',', 1)[0]}; {args.requests} requests of {args.max_new} new tokens cycling "
             f"through `{args.prompts}`; continuous batching; one run.", "",
             "Cells: tokens/s (speed-up over `none` at the same batch size) / acceptance length.", ""]
    for temperature in args.temperatures:
        lines += [f"## T={temperature:g}", "", "| config | " + " | ".join(f"batch {b}" for b in args.batches) + " |",
                  "|---" * (len(args.batches) + 1) + "|"]
        for name in args.configs:
            cells = []
            for batch in args.batches:
                (row,) = [r for r in results if (r["config"], r["batch"], r["temperature"]) == (name, batch, temperature)]
                ratio = row["tokens_per_s"] / base[(temperature, batch)] if (temperature, batch) in base else float("nan")
                cells.append(f"{row['tokens_per_s']:.1f} ({ratio:.2f}x) / {row['acceptance_length']:.2f}")
            lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
        lines.append("")
    args.out.write_text("\n".join(lines))
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, "rows": results}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
