"""Traversal verification vs node-by-node tree rejection on the engine's own trees, paired.

Usage: chrt -f 5 .venv/bin/python benchmarks/bench_traversal.py [--configs eagle3 ...] [--replays 200]
           [--prompts benchmarks/prompts/heldout_families.jsonl] [--max-new 48] [--seed 0] [--repeats 1]
           [--out benchmarks/results_traversal_paired.md]

End-to-end runs compare the two rules through different random trajectories, so a few-percent difference drowns
in the spread between runs. Here the engine runs each configuration at T=1 (batch 1, chat template, as
``bench_unseen.py`` builds it) and every tree it verifies (its target rows, node tokens, parents and q) is also
verified ``--replays`` more times under each rule with the same fresh uniforms for both: the mean tokens emitted
per verify step of the two rules on the same real trees, and the paired difference with its standard error
(per-step means, so the error reflects the spread over trees).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch
from bench_unseen import build_engine, machine

import specdec_cli.engine.tree as engine_tree
from specdec_cli.engine.drive import warm_up
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.workload import encode_prompt
from specdec_cli.models import load_model
from specdec_cli.sampling.tree import tree_accept

RULES = ("block", "token")  # traversal verification, node by node


class Replay:
    """Wraps ``tree_accept`` in the tree engine: each real call is also replayed under both rules."""

    def __init__(self, replays: int, seed: int) -> None:
        self.replays, self.generator = replays, torch.Generator().manual_seed(seed)
        self.family = ""
        self.steps: dict[str, list[tuple[float, float, int]]] = defaultdict(list)  # family -> (block, token, nodes)

    def __call__(self, target_probs, node_tokens, parents, node_draft_probs=None, generators=None, **kwargs):
        nodes = node_tokens.shape[1]
        if nodes:
            uniforms = torch.rand(self.replays, nodes + 1, generator=self.generator, dtype=torch.float64)
            means = []
            for rule in RULES:
                emitted = [int(tree_accept(target_probs, node_tokens, parents, node_draft_probs,
                                           uniforms=uniforms[i:i + 1], verification=rule)[1][0])
                           for i in range(self.replays)]
                means.append(sum(emitted) / self.replays)
            self.steps[self.family].append((means[0], means[1], nodes))
        return tree_accept(target_probs, node_tokens, parents, node_draft_probs, generators, **kwargs)


def summary(steps: list[tuple[float, float, int]]) -> dict[str, float]:
    n = len(steps)
    block = sum(s[0] for s in steps) / n
    token = sum(s[1] for s in steps) / n
    diffs = [s[0] - s[1] for s in steps]
    mean = sum(diffs) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / max(n - 1, 1) / n)
    return {"steps": n, "traversal": block, "node_by_node": token, "difference": mean, "se": se,
            "gain": block / token - 1, "nodes": sum(s[2] for s in steps) / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["eagle3"])
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--prompts", type=Path, default=Path("benchmarks/prompts/heldout_families.jsonl"))
    parser.add_argument("--max-new", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results_traversal_paired.md"))
    args = parser.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    target, tokenizer = load_model(None)
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    results = {}
    for name in args.configs:
        engine = build_engine(target, tokenizer, name.split(), temperature=1.0)
        warm_up(engine, encode_prompt(tokenizer, rows[0]["prompt"], chat=True))
        replay = Replay(args.replays, args.seed)
        engine_tree.tree_accept = replay
        try:
            for index, row in [(r * len(rows) + i, row) for r in range(args.repeats) for i, row in enumerate(rows)]:
                replay.family = row["id"].split("_")[0]
                request = Request(id=str(index), prompt_token_ids=encode_prompt(tokenizer, row["prompt"], chat=True),
                                  max_new_tokens=args.max_new, params=SamplingParams(1.0, seed=args.seed + index),
                                  eos_token_ids=(tokenizer.eos_token_id,))
                engine.add_request(request)
                while engine.has_work():
                    engine.step()
                print(f"{name}: prompt {index + 1}/{args.repeats * len(rows)} done", flush=True)
        finally:
            engine_tree.tree_accept = tree_accept
        families = sorted(replay.steps)
        results[name] = {family: summary(replay.steps[family]) for family in families}
        results[name]["all"] = summary([s for family in families for s in replay.steps[family]])
    write(args, results)


def write(args, results: dict) -> None:
    lines = ["# Traversal verification vs node-by-node tree rejection, paired on the engine's trees "
             "(`benchmarks/bench_traversal.py`)", "", f"Command: `python {' '.join(sys.argv)}`  ",
             f"Machine: {machine()}; T=1, {args.max_new} new tokens per prompt, prompts `{args.prompts}`, "
             f"{args.replays} replays of every verified tree under each rule (same uniforms for both).", "",
             "Cells: mean tokens emitted per verify step under traversal / node by node, the paired difference "
             "± its standard error over trees, and the gain.", "",
             "| config | family | trees | nodes per tree | traversal | node by node | difference | gain |",
             "|---|---|---|---|---|---|---|---|"]
    for name, families in results.items():
        for family, s in families.items():
            lines.append(f"| `{name}` | {family} | {s['steps']} | {s['nodes']:.1f} | {s['traversal']:.3f} | "
                         f"{s['node_by_node']:.3f} | {s['difference']:+.4f} ± {s['se']:.4f} | {s['gain']:+.1%} |")
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"command": " ".join(sys.argv), "machine": machine(),
                                                          "results": results}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
