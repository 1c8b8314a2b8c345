"""What the suffix enhancer can win on the benchmark prompts, offline: the target's greedy answers are generated once,
then for every answer position the request's own suffix match (prompt + answer so far) is looked up.

Usage: .venv/bin/python benchmarks/bench_retrieval.py [--max-new 48] [--k 4]

Prints, per prompt file: (1) the share of answer tokens outside the shipped EAGLE-3 head's draft vocabulary, per
family (the head can never draft them; retrieval can copy them); (2) per match length (2, 3, 4, 5, >= 6 tokens):
how many positions had such a match and how many of the next ``k`` answer tokens its continuation got right on
average; (3) the same restricted to the draft vocabulary (the continuation cut at its first token outside it, as the
enhancer did before 2026-12-05). Results: benchmarks/results_enhancer_vocab.md.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch
from safetensors.torch import load_file

from specdec_cli.api import LLM, SamplingParams
from specdec_cli.drafters.suffix import SuffixAutomaton

ROOT = Path(__file__).resolve().parents[1]
FILES = ["heldout_families", "unseen", "mt_bench_first_turns"]
HEAD = ROOT / "specdec_cli/drafters/assets/smollm2_135m/eagle3/model.safetensors"


def common_prefix(draft: list[int], answer: list[int]) -> int:
    n = 0
    while n < min(len(draft), len(answer)) and draft[n] == answer[n]:
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-new", type=int, default=48)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    in_vocab = load_file(str(HEAD))["t2d"]  # [V] bool: the target id has a draft id
    llm = LLM(["method=none"])
    for name in FILES:
        rows = [json.loads(line) for line in (ROOT / f"benchmarks/prompts/{name}.jsonl").open()]
        outputs = llm.chat([[{"role": "user", "content": r["prompt"]}] for r in rows],
                           SamplingParams(max_tokens=args.max_new, temperature=0.0))
        outside, total = defaultdict(int), defaultdict(int)
        matches = defaultdict(lambda: [0, 0, 0])  # match length -> [positions, right tokens, right in vocab]
        for row, out in zip(rows, outputs):
            family, answer = row["id"].split("_")[0], out.token_ids
            outside[family] += int((~in_vocab[torch.tensor(answer)]).sum())
            total[family] += len(answer)
            automaton = SuffixAutomaton()
            for token in out.prompt_token_ids:
                automaton.extend(token)
            for t, token in enumerate(answer):
                length, end = automaton.self_match()
                if length >= 2:
                    draft = automaton.tokens[end + 1: end + 1 + args.k]
                    cut = next((i for i, d in enumerate(draft) if not in_vocab[d]), len(draft))
                    stats = matches[min(length, 6)]
                    stats[0] += 1
                    stats[1] += common_prefix(draft, answer[t:])
                    stats[2] += common_prefix(draft[:cut], answer[t:])
                automaton.extend(token)
        print(f"== {name}: answer tokens outside the draft vocabulary: "
              + ", ".join(f"{f} {outside[f] / total[f]:.1%}" for f in sorted(total)))
        for length, (positions, right, right_in_vocab) in sorted(matches.items()):
            print(f"   match {length}{'+' if length == 6 else ''}: {positions} positions, "
                  f"{right / positions:.2f} right of {args.k} ({right_in_vocab / positions:.2f} cut at the vocabulary)")


if __name__ == "__main__":
    main()
