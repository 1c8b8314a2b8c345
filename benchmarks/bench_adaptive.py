"""Chain vs confidence stop vs suffix enhancer vs adaptive skipping, per prompt family, on the embedded target.

Usage: .venv/bin/python benchmarks/bench_adaptive.py [--method eagle3] [--max-new 48] [--temperature 0]
                                                      [--prompts benchmarks/prompts/unseen.jsonl]

Batch 1, K=4, chat template; every configuration runs every prompt, configurations alternating inside each
prompt. The family of a prompt is its id up to the first '_'. Reported per family: acceptance length (tokens
per verify step), target forwards, and tokens/s relative to method=none in the same run (a ratio: the
machine may be busy; acceptance length and forwards do not depend on it).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections import defaultdict
from pathlib import Path

import torch

from specdec_cli.config.methods import method_schemas
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.engine.adaptive import skip_rule
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.workload import encode_prompt
from specdec_cli.models import load_model

VARIANTS = {
    "chain": {},
    "conf 0.3": {"draft_confidence": 0.3},
    "conf 0.5": {"draft_confidence": 0.5},
    "enhancer (min 4)": {"suffix_enhancer": True},
    "enhancer + conf 0.3": {"suffix_enhancer": True, "draft_confidence": 0.3},
    "skip < 0.5": {"adaptive_min_accept": 0.5},
}


def engine_for(model, method) -> SpecEngine:
    deps = DrafterDeps(model, 1, 2048, model.arch.vocab_size, torch.device("cpu"), torch.float32)
    return SpecEngine(model, build_drafter(method, deps), EngineOptions(
        max_batch_size=1, max_seq_len=2048, max_draft_len=method.num_draft_tokens, skip=skip_rule(method)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="eagle3")
    parser.add_argument("--max-new", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--prompts", type=Path, default=Path("benchmarks/prompts/unseen.jsonl"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=0, help="first N prompts only (0: all)")
    args = parser.parse_args()
    model, tokenizer = load_model(None)
    schemas = method_schemas()
    engines = {"none": engine_for(model, schemas["none"]())}
    for name, knobs in VARIANTS.items():
        engines[name] = engine_for(model, dataclasses.replace(schemas[args.method](), **knobs))
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    rows = rows[: args.limit] if args.limit > 0 else rows
    # (config, family) -> [tokens, seconds, verify steps]
    tally: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0])
    for index, row in enumerate(rows):
        ids = encode_prompt(tokenizer, row["prompt"], chat=True)
        family = row["id"].split("_")[0]
        for name, engine in engines.items():
            request = Request(id=str(index), prompt_token_ids=ids, max_new_tokens=args.max_new,
                              params=SamplingParams(args.temperature, seed=index),
                              eos_token_ids=(tokenizer.eos_token_id,))
            steps, start = engine.stats.verify_steps, time.perf_counter()
            engine.add_request(request)
            while engine.has_work():
                engine.step()
            for key in ((name, family), (name, "all")):
                cell = tally[key]
                cell[0] += len(request.output_token_ids)
                cell[1] += time.perf_counter() - start
                cell[2] += engine.stats.verify_steps - steps
        text = table(tally, list(engines), args)
        print(f"after prompt {index + 1}/{len(rows)}:\n{text}\n", flush=True)
        if args.out:
            args.out.write_text(text + "\n")


def table(tally: dict[tuple[str, str], list[float]], configs: list[str], args: argparse.Namespace) -> str:
    """Markdown: one row per configuration, one column per family (and all)."""
    families = sorted({family for _, family in tally if family != "all"}) + ["all"]
    lines = [f"method={args.method}, T={args.temperature}, {args.max_new} new tokens, batch 1, K=4; "
             "cells: acceptance length (tokens per verify step) / target forwards / tokens/s vs none", "",
             "| config | " + " | ".join(families) + " |", "|---" * (len(families) + 1) + "|"]
    for name in configs:
        cells = []
        for family in families:
            tokens, seconds, steps = tally[(name, family)]
            base_tokens, base_seconds, _ = tally[("none", family)]
            speed = (tokens / seconds) / (base_tokens / base_seconds)
            cells.append(f"{tokens / steps:.2f} / {int(steps)} / {speed:.2f}x")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

if __name__ == "__main__":
    main()
