"""Speculative methods vs autoregressive on the embedded default, and vs HF transformers.

Usage: .venv/bin/python benchmarks/bench_methods.py [--prompts 6] [--max-new 96] [--k 4]
                                                     [--out benchmarks/results_methods.md]

Protocol: MT-Bench first turns (chat template), batch 1, K draft tokens, greedy and
temperature 1. Every configuration runs on every prompt, configurations alternate inside
each prompt (machine noise hits all alike), and tokens/s is total tokens over total time
per configuration, so each speed-up is a ratio from one run. HF rows run the same weights
with ``generate``: plain, ``prompt_lookup_num_tokens=K`` and ``assistant_model`` = the
target's first N layers (the same pair as ``draft_target self_speculative_layers=N``).
"""
from __future__ import annotations

import argparse
import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from specdec_cli.config.schema import (
    DraftTargetMethodConfig,
    Eagle3MethodConfig,
    MethodConfig,
    NgramMethodConfig,
    NoneMethodConfig,
    SuffixMethodConfig,
    WorkloadConfig,
)
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.workload import encode_prompt, load_prompts
from specdec_cli.models import load_model
from specdec_cli.models.loading import EMBEDDED_NAME, cached_gguf_dir, embedded_model_path
from specdec_cli.run.drive import run_requests

SELF_SPEC_LAYERS = 4


@dataclass
class Tally:
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    drafts: int = 0
    accepted: int = 0
    emitted: int = 0  # tokens emitted by verify steps (acceptance length = emitted / steps)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def ours(model, tokenizer, method: MethodConfig) -> Callable[[list[int], float, int, int], Tally]:
    deps = DrafterDeps(model, 1, 2048, model.arch.vocab_size, torch.device("cpu"), torch.float32, tokenizer)
    drafter = build_drafter(method, deps)
    engine = SpecEngine(model, drafter, EngineOptions(max_batch_size=1, max_seq_len=2048,
                                                      max_draft_len=method.num_draft_tokens))

    def run(prompt_ids: list[int], temperature: float, max_new: int, seed: int) -> Tally:
        before = copy.copy(engine.stats)
        request = Request(id="0", prompt_token_ids=prompt_ids, params=SamplingParams(temperature, seed=seed),
                          max_new_tokens=max_new, eos_token_ids=(tokenizer.eos_token_id,))
        start = time.perf_counter()
        run_requests(engine, [request])
        stats = engine.stats
        elapsed = time.perf_counter() - start
        return Tally(len(request.output_token_ids), elapsed, stats.verify_steps - before.verify_steps,
                     stats.proposed_drafts - before.proposed_drafts, stats.accepted_drafts - before.accepted_drafts,
                     emitted=stats.emitted_tokens - before.emitted_tokens)

    return run


def hf(hf_model, tokenizer, **generate_kwargs) -> Callable[[list[int], float, int, int], Tally]:
    def run(prompt_ids: list[int], temperature: float, max_new: int, seed: int) -> Tally:
        torch.manual_seed(seed)
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature else dict(do_sample=False)
        ids = torch.tensor([prompt_ids])
        start = time.perf_counter()
        with torch.inference_mode():
            out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                    pad_token_id=tokenizer.eos_token_id, **sampling, **generate_kwargs)
        return Tally(out.shape[1] - ids.shape[1], time.perf_counter() - start)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new", type=int, default=96)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results_methods.md"))
    parser.add_argument("--no-hf", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, tokenizer = load_model(None)
    k = args.k
    configs: dict[str, Callable] = {
        "none": ours(model, tokenizer, NoneMethodConfig()),
        "ngram": ours(model, tokenizer, NgramMethodConfig(num_draft_tokens=k)),
        "suffix": ours(model, tokenizer, SuffixMethodConfig(num_draft_tokens=k)),
        f"draft_target (first {SELF_SPEC_LAYERS} layers)": ours(
            model, tokenizer, DraftTargetMethodConfig(self_speculative_layers=SELF_SPEC_LAYERS, num_draft_tokens=k)),
        # the shipped head at conf/method/eagle3.yaml's settings (confidence stop 0.3; suffix enhancer auto)
        "eagle3 (shipped)": ours(model, tokenizer, Eagle3MethodConfig(num_draft_tokens=k, draft_confidence=0.3)),
    }
    if not args.no_hf:
        from transformers import AutoModelForCausalLM

        directory = cached_gguf_dir(embedded_model_path(), name=EMBEDDED_NAME)
        hf_model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        assistant = copy.deepcopy(hf_model)
        assistant.model.layers = assistant.model.layers[:SELF_SPEC_LAYERS]
        assistant.config.num_hidden_layers = SELF_SPEC_LAYERS
        assistant.generation_config.num_assistant_tokens = k
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        configs["HF generate"] = hf(hf_model, tokenizer)
        configs[f"HF prompt lookup (k={k})"] = hf(hf_model, tokenizer, prompt_lookup_num_tokens=k)
        configs[f"HF assisted (first {SELF_SPEC_LAYERS} layers)"] = hf(hf_model, tokenizer, assistant_model=assistant)
    prompts = load_prompts(WorkloadConfig(source="mt_bench", num_prompts=args.prompts))
    encoded = [encode_prompt(tokenizer, p.text, chat=True) for p in prompts]
    tallies = {(name, t): Tally() for name in configs for t in (0.0, 1.0)}
    for run in configs.values():  # warm-up, untimed: JIT compiles, kernel probes, weight packing
        for temperature in (0.0, 1.0):
            run(encoded[0], temperature, 8, 0)
    for index, prompt_ids in enumerate(encoded):
        for temperature in (0.0, 1.0):
            order = list(configs) if index % 2 == 0 else list(reversed(configs))
            for name in order:
                result = configs[name](prompt_ids, temperature, args.max_new, index)
                tally = tallies[(name, temperature)]
                tally.tokens += result.tokens
                tally.seconds += result.seconds
                tally.steps += result.steps
                tally.drafts += result.drafts
                tally.accepted += result.accepted
                tally.emitted += result.emitted
        print(f"prompt {index + 1}/{len(encoded)} done", flush=True)
    write_table(args, tallies, configs)


def write_table(args, tallies, configs) -> None:
    lines = [
        "| configuration | sampler | tokens/s | speed-up vs ours `none` | acceptance length | acceptance rate |",
        "|---|---|---|---|---|---|",
    ]
    for temperature in (0.0, 1.0):
        base = tallies[("none", temperature)].tokens_per_s
        for name in configs:
            tally = tallies[(name, temperature)]
            length = f"{tally.emitted / tally.steps:.2f}" if tally.steps else "-"
            rate = f"{tally.accepted / tally.drafts:.1%}" if tally.drafts else "-"
            sampler = "greedy" if temperature == 0 else "T=1"
            lines.append(f"| {name} | {sampler} | {tally.tokens_per_s:.1f} | {tally.tokens_per_s / base:.2f}x | "
                         f"{length} | {rate} |")
    command = (f".venv/bin/python benchmarks/bench_methods.py --prompts {args.prompts} --max-new {args.max_new} "
               f"--k {args.k}")
    text = "\n".join([f"Command: `{command}`", "", *lines, ""])
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
