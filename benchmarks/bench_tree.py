"""EAGLE-3 chain vs dynamic trees: acceptance length on the embedded target, greedy and sampled.

Usage: .venv/bin/python benchmarks/bench_tree.py [--max-new 48] [--temperatures 0 1] [--seeds 3]
                                                 [--prompts benchmarks/prompts/unseen.jsonl] [--limit N]
                                                 [--out benchmarks/results_tree.md]

Batch 1, chat template, the shipped eagle3 head; configurations alternate inside each prompt. Sampled rows
(T > 0) run ``--seeds`` seeds per prompt (request seed = seed index * 1000 + prompt index) since one seed
is noisy. Reported: acceptance length (tokens per verify step, bonus included), verify steps and the gain
over the chain; greedy rows also check every output against the chain's (the tree must equal autoregressive
greedy). Acceptance length does not depend on the machine's load; speed is not reported.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
from collections import defaultdict
from pathlib import Path

import torch

from specdec_cli.config.methods import method_schemas
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.tree import TreeSpecEngine
from specdec_cli.engine.workload import encode_prompt
from specdec_cli.models import load_model

K = 4
CONFIGS = {  # name -> (tree_topk, max_total_draft_tokens)
    f"chain K={K}": (1, None),
    "tree topk=4, 12 nodes": (4, 12),
    "tree topk=2, 8 nodes": (2, 8),
}
MAX_SEQ_LEN = 2048


def engine_for(model, topk: int, max_nodes: int | None) -> SpecEngine:
    method = dataclasses.replace(method_schemas()["eagle3"](), num_draft_tokens=K, tree_topk=topk,
                                 max_total_draft_tokens=max_nodes)
    deps = DrafterDeps(model, 1, MAX_SEQ_LEN, model.arch.vocab_size, torch.device("cpu"), torch.float32)
    options = EngineOptions(max_batch_size=1, max_seq_len=MAX_SEQ_LEN, max_draft_len=K)
    drafter = build_drafter(method, deps)
    if topk > 1:
        return TreeSpecEngine(model, drafter, options, max_nodes=max_nodes)
    return SpecEngine(model, drafter, options)


def generate(engine: SpecEngine, request: Request) -> tuple[list[int], int, int]:
    """(output ids, verify steps, tokens those steps emitted) of one request run alone."""
    steps, emitted = engine.stats.verify_steps, engine.stats.emitted_tokens
    engine.add_request(request)
    while engine.has_work():
        engine.step()
    return request.output_token_ids, engine.stats.verify_steps - steps, engine.stats.emitted_tokens - emitted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new", type=int, default=48)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per prompt at T > 0")
    parser.add_argument("--prompts", type=Path, default=Path("benchmarks/prompts/unseen.jsonl"))
    parser.add_argument("--limit", type=int, default=0, help="first N prompts only (0: all)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results_tree.md"))
    args = parser.parse_args()
    model, tokenizer = load_model(None)
    engines = {name: engine_for(model, *knobs) for name, knobs in CONFIGS.items()}
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    rows = rows[: args.limit] if args.limit > 0 else rows
    tally: dict[tuple[str, float], list[int]] = defaultdict(lambda: [0, 0])  # emitted tokens, verify steps
    mismatches: dict[str, int] = defaultdict(int)
    for index, row in enumerate(rows):
        ids = encode_prompt(tokenizer, row["prompt"], chat=True)
        for temperature in args.temperatures:
            for seed in range(args.seeds if temperature > 0 else 1):
                reference = None
                for name, engine in engines.items():
                    request = Request(id=f"{index}/{seed}", prompt_token_ids=ids, max_new_tokens=args.max_new,
                                      params=SamplingParams(temperature, seed=seed * 1000 + index),
                                      eos_token_ids=(tokenizer.eos_token_id,))
                    output, steps, emitted = generate(engine, request)
                    cell = tally[(name, temperature)]
                    cell[0], cell[1] = cell[0] + emitted, cell[1] + steps
                    if temperature == 0:
                        reference = output if reference is None else reference
                        mismatches[name] += output != reference
        text = table(tally, args, index + 1, mismatches)
        print(f"after prompt {index + 1}/{len(rows)}:\n{text}\n", flush=True)
        args.out.write_text(header(args, len(rows)) + text + "\n")  # rewritten after every prompt


def header(args: argparse.Namespace, num_prompts: int) -> str:
    command = " ".join(["python", *sys.argv])
    return (f"# EAGLE-3 chain vs dynamic tree: acceptance length\n\n"
            f"Machine: {platform.node()}, {platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} torch threads, CPU float32 (shared and busy: speed not reported).\n"
            f"Command: `.venv/bin/{command}`\n"
            f"Prompts: {args.prompts} ({num_prompts}), {args.max_new} new tokens, batch 1, depth K={K}, "
            f"seeds per prompt at T > 0: {args.seeds}.\n\n")


def table(tally: dict[tuple[str, float], list[int]], args: argparse.Namespace, done: int,
          mismatches: dict[str, int]) -> str:
    """Markdown: one row per (temperature, configuration)."""
    lines = [f"{done} prompt(s). Acceptance length = generated tokens / verify steps (bonus included).", "",
             "| T | config | acceptance length | vs chain | verify steps | greedy output == chain's |",
             "|---|---|---|---|---|---|"]
    chain = next(iter(CONFIGS))
    for temperature in args.temperatures:
        base_tokens, base_steps = tally[(chain, temperature)]
        for name in CONFIGS:
            tokens, steps = tally[(name, temperature)]
            length = tokens / max(steps, 1)
            gain = length / (base_tokens / max(base_steps, 1)) - 1
            same = "-" if temperature > 0 else ("yes" if mismatches[name] == 0 else f"{mismatches[name]} differ")
            lines.append(f"| {temperature:g} | {name} | {length:.3f} | {gain:+.1%} | {steps} | {same} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
