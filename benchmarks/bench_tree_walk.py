"""Tree acceptance on CPU: the compiled walk (``sampling/cpu_tree.py``) vs the torch walk, hot and end to end.

Usage: chrt -f 5 .venv/bin/python benchmarks/bench_tree_walk.py [--reps 30] [--end-to-end --seed 5000]

Hot: median ms of one ``tree_accept`` call (one row, the target's 49,152-token vocabulary) for a 4-node chain and a
topk 2 / 8-node tree, with sampled q and with one-hot q. End to end (``--end-to-end``): the Python API's default
``LLM(["method=eagle3"])`` (the auto tree: its T=1 requests verify sampled trees) against ``method=none`` on the
held-out families at T=1, 64 tokens, two passes, the two walks interleaved per prompt in one process; prints
tokens/s, the ratio over ``none``, acceptance length and the accept phase per step.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec_cli.sampling import tree
from specdec_cli.sampling.tree import tree_accept

VOCAB = 49_152
SHAPES = {"chain, 4 nodes": [-1, 0, 1, 2], "topk 2, 8 nodes": [-1, -1, 0, 1, 2, 3, 4, 5]}
PROMPTS = Path(__file__).parent / "prompts" / "heldout_families.jsonl"
WALKS = {"compiled": tree._cpu_kernel, "torch": lambda: None}  # what tree_accept's kernel lookup returns


def hot(reps: int) -> None:
    generator = torch.Generator().manual_seed(0)
    print("| tree | q | compiled ms | torch ms |\n|---|---|---|---|")
    for name, parents in SHAPES.items():
        parents = torch.tensor(parents)
        nodes = parents.numel()
        for sampled in (True, False):
            target = (3 * torch.randn(1, nodes + 1, VOCAB, generator=generator)).softmax(-1)
            draft = (3 * torch.randn(1, nodes, VOCAB, generator=generator)).softmax(-1) if sampled else None
            node_tokens = torch.randint(0, VOCAB, (1, nodes), generator=generator)
            medians = {}
            for walk, kernel in WALKS.items():
                tree._cpu_kernel = kernel
                times = []
                for rep in range(reps + 3):
                    start = time.perf_counter()
                    tree_accept(target, node_tokens, parents, draft, torch.Generator().manual_seed(rep))
                    times.append(time.perf_counter() - start)
                medians[walk] = sorted(times[3:])[reps // 2] * 1e3
            tree._cpu_kernel = WALKS["compiled"]
            print(f"| {name} | {'sampled' if sampled else 'one-hot'} | {medians['compiled']:.3f} | {medians['torch']:.3f} |")


def end_to_end(seed: int) -> None:
    from specdec_cli.api.llm import LLM
    from specdec_cli.api.params import SamplingParams

    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line.strip()]
    none, eagle3 = LLM(["method=none"]), LLM(["method=eagle3"])
    arms = {"none": (none, WALKS["compiled"]), "eagle3, compiled walk": (eagle3, WALKS["compiled"]),
            "eagle3, torch walk": (eagle3, WALKS["torch"])}
    params = lambda s: SamplingParams(temperature=1.0, max_tokens=64, seed=s)  # noqa: E731
    for llm, kernel in arms.values():  # warm-up
        tree._cpu_kernel = kernel
        llm.generate(prompts[:1], params(0))
    totals = {name: [0, 0.0, 0, 0.0] for name in arms}  # tokens, step seconds, verify steps, accept seconds
    for rep in range(2):
        for i, prompt in enumerate(prompts):
            for name, (llm, kernel) in arms.items():
                tree._cpu_kernel = kernel
                stats = llm.pipeline.engine.stats
                before = (stats.generated_tokens, stats.step_s, stats.verify_steps, stats.accept_s)
                llm.generate([prompt], params(seed + i + rep * 100))
                after = (stats.generated_tokens, stats.step_s, stats.verify_steps, stats.accept_s)
                totals[name] = [t + a - b for t, a, b in zip(totals[name], after, before)]
    tree._cpu_kernel = WALKS["compiled"]
    base = totals["none"][0] / totals["none"][1]
    print("\n| config | tokens/s | vs none | acceptance | accept ms / step |\n|---|---|---|---|---|")
    for name, (tokens, seconds, steps, accept) in totals.items():
        print(f"| {name} | {tokens / seconds:.2f} | {tokens / seconds / base:.3f}x | {tokens / steps:.3f} | "
              f"{accept / steps * 1e3:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--end-to-end", action="store_true")
    parser.add_argument("--seed", type=int, default=5000)
    args = parser.parse_args()
    hot(args.reps)
    if args.end_to_end:
        end_to_end(args.seed)


if __name__ == "__main__":
    main()
