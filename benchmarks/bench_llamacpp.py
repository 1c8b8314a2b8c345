"""Plain decode vs llama.cpp on the same GGUF weights (the CPU anchor), greedy, batch 1.

Usage: chrt -f 5 .venv/bin/python benchmarks/bench_llamacpp.py [--max-new 48] [--threads 2]
           [--prompts benchmarks/prompts/unseen.jsonl] [--out benchmarks/results_llamacpp.md]
Needs the optional extra: pip install -e ".[llamacpp]" (builds llama.cpp from source).

The embedded target is SmolLM2-135M-Instruct.Q4_1.gguf. llama.cpp runs it as it is (Q4_1 kernels); specdec
dequantises it once to float32 (model.dtype=float32) or re-quantises that per channel (model.dtype=int8).
Every engine gets the same chat-templated prompt ids and generates ``--max-new`` greedy tokens; decode time per
token (TPOT) = (end - first token) / (tokens - 1), prefill = time to the first token. Also reported: how many
leading tokens llama.cpp's output shares with specdec float32 (the Q4_1 kernels round differently).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from specdec_cli.engine.drive import run_to_completion
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.workload import encode_prompt
from specdec_cli.models import embedded_model_path, load_model
from specdec_cli.models.quantize import quantize_model


def specdec_runs(target, prompts: list[list[int]], max_new: int, eos: int) -> list[tuple[list[int], float, float]]:
    """(tokens, prefill s, TPOT s) per prompt with method=none at batch 1."""
    engine = SpecEngine(target, None, EngineOptions(max_batch_size=1, max_seq_len=2048))
    out = []
    for ids in prompts:
        (request,) = run_to_completion(engine, [Request(id="r", prompt_token_ids=ids, max_new_tokens=max_new,
                                                        params=SamplingParams(0.0), eos_token_ids=(eos,))])
        out.append((request.output_token_ids, request.ttft_s, request.tpot_s or 0.0))
    return out


def llamacpp_runs(prompts: list[list[int]], max_new: int, eos: int, threads: int) -> list[tuple[list[int], float, float]]:
    from llama_cpp import Llama  # the optional extra

    llm = Llama(model_path=str(embedded_model_path()), n_ctx=2048, n_threads=threads, n_batch=512, verbose=False)
    out = []
    for ids in prompts:
        llm.reset()
        start = time.perf_counter()
        tokens, first = [], 0.0
        for token in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if not tokens:
                first = time.perf_counter()
            tokens.append(int(token))
            if token == eos or len(tokens) == max_new:
                break
        end = time.perf_counter()
        out.append((tokens, first - start, (end - first) / max(1, len(tokens) - 1)))
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new", type=int, default=48)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--prompts", type=Path, default=Path("benchmarks/prompts/unseen.jsonl"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results_llamacpp.md"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_model(None)
    eos = tokenizer.eos_token_id
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    prompts = [encode_prompt(tokenizer, row["prompt"], chat=True) for row in rows]
    runs = {"specdec float32": specdec_runs(target, prompts, args.max_new, eos)}
    runs["specdec int8"] = specdec_runs(quantize_model(target), prompts, args.max_new, eos)
    runs["llama.cpp Q4_1"] = llamacpp_runs(prompts, args.max_new, eos, args.threads)
    base = statistics.fmean(tpot for _, _, tpot in runs["specdec float32"])
    command = "python " + " ".join(sys.argv)
    lines = ["# Plain decode vs llama.cpp (`benchmarks/bench_llamacpp.py`)", "", f"Command: `{command}`  ",
             f"Machine: {platform.machine()}, {os.cpu_count()} vCPUs, {args.threads} threads, torch {torch.__version__}; "
             f"{len(prompts)} prompts from `{args.prompts}`, {args.max_new} greedy tokens, batch 1; one run.", "",
             "| engine | decode tokens/s (1 / mean TPOT) | vs specdec float32 | mean prefill ms | "
             "mean prompt tokens | tokens equal to float32 (leading) |", "|---|---:|---:|---:|---:|---:|"]
    reference = runs["specdec float32"]
    mean_prompt = statistics.fmean(len(p) for p in prompts)
    for name, results in runs.items():
        tpot = statistics.fmean(t for _, _, t in results)
        prefill = statistics.fmean(p for _, p, _ in results)
        same = sum(common_prefix(tokens, ref[0]) for (tokens, _, _), ref in zip(results, reference))
        total = sum(len(ref[0]) for ref in reference)
        lines.append(f"| {name} | {1 / tpot:.1f} | {base / tpot:.2f}x | {1000 * prefill:.0f} | {mean_prompt:.0f} | "
                     f"{same}/{total} |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
