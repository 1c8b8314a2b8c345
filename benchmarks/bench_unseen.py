"""Speculation on prompt families no drafter was trained on: every configuration vs ``method=none``, per family.

Usage: chrt -f 5 .venv/bin/python benchmarks/bench_unseen.py [--max-new 48] [--temperatures 0 1]
           [--configs none suffix "eagle3 method.suffix_enhancer=false" eagle3 ...]
           [--prompts benchmarks/prompts/unseen.jsonl] [--repeats 1] [--seed 0] [--out benchmarks/results_unseen.md]

Engines are built per temperature, as `specdec run` with that sampler would build them (EAGLE-3's auto tree
has 8 nodes greedy, K + 1 sampled), and first run the engine warm-up (unmeasured). Each configuration is a list
of ``specdec run`` overrides, composed and validated exactly as the CLI does (so ``eagle3`` is the shipped
default: the suffix enhancer resolves on). The target loads once; every configuration runs every prompt, configurations alternating inside each prompt, batch 1, chat template, the
prompt's family is its id up to the first '_'. Per family and temperature: acceptance length (tokens per verify
step), tokens/s as a ratio to ``none`` from the same run (end to end, and over all families for the decode
phase: after each prompt's first token), and the time breakdown (target forward / draft /
accept / other) summed over the run. Writes markdown and a JSON of every number.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from bench_model import machine as cpu_and_torch

from specdec_cli.config.compose import compose_config
from specdec_cli.config.validate import resolve
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.engine.drive import warm_up
from specdec_cli.engine.engine import SpecEngine
from specdec_cli.engine.metrics import SpecStats
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.workload import encode_prompt
from specdec_cli.models import load_model
from specdec_cli.models.quantize import quantize_model
from specdec_cli.run.pipeline import build_engine as pipeline_engine
from specdec_cli.run.pipeline import with_resolved_method

DEFAULT_CONFIGS = ["none", "suffix", "eagle3 method.suffix_enhancer=false", "eagle3",
                   "eagle3 method.tree_topk=4 method.max_total_draft_tokens=12"]
MAX_SEQ_LEN = 2048


def build_engine(target, tokenizer, overrides: list[str], batch: int = 1, dtype: str = "float32",
                 temperature: float = 0.0) -> SpecEngine:
    """The engine ``specdec run <overrides> engine.max_batch_size=<batch> model.dtype=<dtype>`` would build, on the
    loaded target (already quantised where ``dtype`` is int8), for requests at ``temperature`` (auto choices such as
    EAGLE-3's tree depend on it)."""
    method = overrides[0] if "=" not in overrides[0] else overrides[0].split("=", 1)[1]
    sampler = ["sampler=temperature", f"sampler.temperature={temperature}"] if temperature > 0 else []
    cfg = compose_config([f"method={method}", *overrides[1:], *sampler, f"engine.max_batch_size={batch}",
                          f"engine.max_seq_len={MAX_SEQ_LEN}", f"model.dtype={dtype}"])
    effective = resolve(cfg)
    deps = DrafterDeps(target=target, num_slots=batch, max_seq_len=MAX_SEQ_LEN, vocab_size=target.arch.vocab_size,
                       device=torch.device("cpu"), dtype=torch.float32, tokenizer=tokenizer,
                       model_dtype=dtype, head_dtype=effective.head_dtype)
    cfg = with_resolved_method(cfg, effective)
    return pipeline_engine(target, build_drafter(cfg.method, deps), cfg, effective)


def machine(dtype: str = "float32") -> str:
    return f"{cpu_and_torch()}, {dtype} target, batch 1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS)
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    parser.add_argument("--max-new", type=int, default=48)
    parser.add_argument("--prompts", type=Path, default=Path("benchmarks/prompts/unseen.jsonl"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results_unseen.md"))
    parser.add_argument("--dtype", choices=["float32", "int8"], default="float32", help="the target's model.dtype")
    parser.add_argument("--seed", type=int, default=0,
                        help="prompt i of pass r samples with seed SEED + r * (number of prompts) + i (T > 0)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="passes over the prompts (pooled: greedy repeats the same tokens, T > 0 new seeds)")
    args = parser.parse_args()
    if args.repeats < 1 or args.max_new < 1:
        parser.error("--repeats and --max-new must be >= 1")
    if "none" not in args.configs:  # every ratio is over it, measured in the same run
        args.configs = ["none", *args.configs]
    command = "python " + " ".join(sys.argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    target, tokenizer = load_model(None)
    if args.dtype == "int8":
        quantize_model(target)
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    # (temperature, config, family) -> [tokens, seconds, verify steps, emitted tokens, tokens after the first,
    # seconds after the first token]; stats per (T, config)
    tally: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0, 0, 0.0])
    stats: dict[tuple, SpecStats] = {}
    for temperature in args.temperatures:
        engines = {name: build_engine(target, tokenizer, name.split(), dtype=args.dtype, temperature=temperature)
                   for name in args.configs}
        for engine in engines.values():  # unmeasured: first-call packing, kernel probes and compiles
            warm_up(engine, encode_prompt(tokenizer, rows[0]["prompt"], chat=True))
        for index, row in [(r * len(rows) + i, row) for r in range(args.repeats) for i, row in enumerate(rows)]:
            ids = encode_prompt(tokenizer, row["prompt"], chat=True)
            family = row["id"].split("_")[0]
            for name, engine in engines.items():
                engine.stats = stats.setdefault((temperature, name), SpecStats())
                steps, emitted = engine.stats.verify_steps, engine.stats.emitted_tokens
                request = Request(id=str(index), prompt_token_ids=ids, max_new_tokens=args.max_new,
                                  params=SamplingParams(temperature, seed=args.seed + index),
                                  eos_token_ids=(tokenizer.eos_token_id,))
                start = time.perf_counter()
                engine.add_request(request)
                while engine.has_work():
                    engine.step()
                seconds = time.perf_counter() - start
                for key in ((temperature, name, family), (temperature, name, "all")):
                    cell = tally[key]
                    cell[0] += len(request.output_token_ids)
                    cell[1] += seconds
                    cell[2] += engine.stats.verify_steps - steps
                    cell[3] += engine.stats.emitted_tokens - emitted
                    if request.chunks and len(request.output_token_ids) > 1:
                        cell[4] += len(request.output_token_ids) - 1
                        cell[5] += request.finish_s - request.chunks[0][0]
            print(f"T={temperature}: prompt {index + 1}/{args.repeats * len(rows)} done", flush=True)
    write(args, command, tally, stats, list(engines))


def write(args, command: str, tally: dict, stats: dict, names: list[str]) -> None:
    families = sorted({key[2] for key in tally if key[2] != "all"}) + ["all"]
    lines = [f"# Unseen prompt families (`benchmarks/bench_unseen.py`)", "",
             f"Command: `{command}`  ", f"Machine: {machine(args.dtype)}; {args.max_new} new tokens per prompt, "
             f"prompts `{args.prompts}` ({len(families) - 1} families); one run"
             + (f", {args.repeats} passes over the prompts, pooled." if args.repeats > 1 else "."), "",
             "Cells: acceptance length (tokens per verify step) / tokens/s relative to `none` in the same run, "
             "end to end (prefill included). Decode phase: tokens/s after each prompt's first token (the prefill "
             "and the first token excluded: what speculation changes), all families, relative to `none`.", ""]
    record = {"command": command, "machine": machine(args.dtype), "rows": []}
    for temperature in args.temperatures:
        lines += [f"## T={temperature:g}", "", "| config | " + " | ".join(families)
                  + " | decode phase | time: target / draft / accept / other |", "|---" * (len(families) + 3) + "|"]
        for name in names:
            cells = []
            for family in families:
                tokens, seconds, steps, emitted, later_tokens, later_seconds = tally[(temperature, name, family)]
                base = tally[(temperature, "none", family)]
                ratio = (tokens / seconds) / (base[0] / base[1])
                decode_ratio = (later_tokens / later_seconds) / (base[4] / base[5]) if later_seconds and base[5] else 0.0
                cells.append(f"{emitted / max(steps, 1):.2f} / {ratio:.2f}x")
                record["rows"].append({"temperature": temperature, "config": name, "family": family,
                                       "acceptance_length": emitted / max(steps, 1), "speedup": ratio,
                                       "decode_speedup": decode_ratio, "tokens": tokens, "seconds": seconds})
            cells.append(f"{decode_ratio:.2f}x")  # the last family: all
            breakdown = stats[(temperature, name)].summary()["time_breakdown_s"]
            total = sum(breakdown.values()) or 1.0
            shares = " / ".join(f"{100 * breakdown[k] / total:.0f}%" for k in ("target_forward", "draft", "accept", "other"))
            lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {shares} |")
        lines.append("")
    args.out.write_text("\n".join(lines))
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
