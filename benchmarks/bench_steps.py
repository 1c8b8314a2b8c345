"""Cost of one speculative step's parts at batch 1: decode (1 token) vs verify (K+1 tokens) vs draft head step.

    .venv/bin/python benchmarks/bench_steps.py [--reps 15] [--contexts 64,768] [--k 4] [--dtypes float32,int8]
        [--profile] [--out benchmarks/results_steps.md]

Every configuration (dtype x context x {decode, verify, head}) is timed once per repetition, in interleaved
order, and the table reports medians, so every ratio comes from one process under the same machine load
(the VM is shared: treat absolute times as provisional). Contexts are prefilled before timing and every timed
forward is rewound afterwards. The head step is the EAGLE-3 head shipped for the embedded target: one head
forward over its slot cache plus its lm_head over the reduced draft vocabulary (what one chain step costs,
without the sampling), once with float32 weights and once with ``method.head_dtype=int8`` (weight-only).
``--profile`` prints the top operators of one decode and one verify per context.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from bench_model import machine
from specdec_cli.drafters.eagle3 import load_eagle3
from specdec_cli.drafters.feature_head import FeatureDrafter
from specdec_cli.models import Transformer, load_model
from specdec_cli.models.quantize import quantize_linears

HEAD_DIR = Path(__file__).resolve().parents[1] / "specdec_cli/drafters/assets/smollm2_135m/eagle3"


def timed(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


class StepCase:
    """A target with one slot prefilled to ``context`` tokens, and the EAGLE-3 head caught up on it."""

    def __init__(self, model: Transformer, context: int, k: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.model, self.k, self.context = model, k, context
        self.cache = model.new_cache(1, context + k + 8)
        self.prompt = torch.randint(0, model.arch.vocab_size, (context,), generator=generator)
        self.new = torch.randint(0, model.arch.vocab_size, (k + 1,), generator=generator)
        model(self.cache, [0], self.prompt, logits_for="last")
        self.heads = {}
        for head_dtype in ("float32", "int8"):
            head = load_eagle3(HEAD_DIR, model)
            if head_dtype == "int8":
                quantize_linears(head, "cpu", "method.head_dtype=int8")
            drafter = FeatureDrafter(head, model, num_slots=1, max_seq_len=context + 8, policy="argmax")
            drafter.cache.advance(0, context - 1)
            self.heads[head_dtype] = (head, drafter)
        self.hidden = torch.randn(1, model.arch.hidden_size, generator=generator)
        self.token = self.new[:1]

    def forward(self, num_tokens: int) -> None:
        """One target forward of ``num_tokens`` new tokens (all their logits), then rewind."""
        self.model(self.cache, [0], self.new[:num_tokens], logits_for="all")
        self.cache.rewind(0, self.context)

    def head_step(self, head_dtype: str) -> None:
        """One EAGLE-3 chain step: head forward on one row + draft-vocabulary logits, then rewind."""
        head, drafter = self.heads[head_dtype]
        out = drafter._step(self.hidden, self.token, [0], [1])
        head.logits(out)
        drafter.cache.rewind(0, self.context - 1)


def run(dtypes: list[str], contexts: list[int], k: int, reps: int, profile: bool) -> dict[tuple, float]:
    cases: dict[tuple[str, int], StepCase] = {}
    for dtype in dtypes:
        model, _ = load_model()
        if dtype == "int8":
            from specdec_cli.models.quantize import quantize_model

            quantize_model(model)
        for context in contexts:
            cases[(dtype, context)] = StepCase(model, context, k)
    parts: dict[str, Callable[[StepCase], None]] = {
        "decode": lambda c: c.forward(1),
        f"verify{k + 1}": lambda c: c.forward(k + 1),
        "head": lambda c: c.head_step("float32"),
        "head_int8": lambda c: c.head_step("int8"),
    }
    times: dict[tuple, list[float]] = {(*key, part): [] for key in cases for part in parts}
    with torch.inference_mode():
        for case in cases.values():  # warm-up (prepacking, allocator)
            for function in parts.values():
                function(case)
                function(case)
        if profile:
            for key, case in cases.items():
                for part in ("decode", f"verify{k + 1}"):
                    with torch.profiler.profile() as prof:
                        parts[part](case)
                    print(f"== {key} {part}")
                    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
        for _ in range(reps):
            for key, case in cases.items():
                for part, function in parts.items():
                    times[(*key, part)].append(timed(lambda: function(case)))
    return {key: statistics.median(values) for key, values in times.items()}


def report(medians: dict[tuple, float], dtypes: list[str], contexts: list[int], k: int, command: str) -> str:
    verify = f"verify{k + 1}"
    lines = [
        "# Step costs at batch 1 (provisional: shared VM, one process, interleaved, medians)",
        "",
        f"- Command: `{command}`; {machine()}; load average {os.getloadavg()[0]:.1f} at the end",
        "",
        f"| target dtype | context | decode ms | {verify} ms | head step ms (float32 / int8 head) | "
        f"{verify} / decode | head / decode (float32 / int8 head) |",
        "|---|---|---|---|---|---|---|",
    ]
    for dtype in dtypes:
        for context in contexts:
            decode, ver, head, head8 = (medians[(dtype, context, p)] for p in ("decode", verify, "head", "head_int8"))
            lines.append(
                f"| {dtype} | {context} | {decode * 1e3:.1f} | {ver * 1e3:.1f} | {head * 1e3:.2f} / {head8 * 1e3:.2f} | "
                f"{ver / decode:.2f} | {100 * head / decode:.1f}% / {100 * head8 / decode:.1f}% |"
            )
    if len(dtypes) > 1:
        base = dtypes[0]
        lines += ["", f"Decode speed-up over {base}: " + ", ".join(
            f"{d} ctx {c}: {medians[(base, c, 'decode')] / medians[(d, c, 'decode')]:.2f}x"
            for d in dtypes[1:] for c in contexts)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--contexts", default="64,768")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtypes, contexts = args.dtypes.split(","), [int(c) for c in args.contexts.split(",")]
    medians = run(dtypes, contexts, args.k, args.reps, args.profile)
    command = (f"python benchmarks/bench_steps.py --reps {args.reps} --contexts {args.contexts} --k {args.k} "
               f"--dtypes {args.dtypes} --threads {args.threads}")
    text = report(medians, dtypes, contexts, args.k, command)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
