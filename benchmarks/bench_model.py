"""Target-model latency on this CPU: decode vs verify (K+1 tokens), against HF transformers.

Usage: .venv/bin/python benchmarks/bench_model.py [--reps 30] [--ctx 128] [--out benchmarks/results_model.md]
On a VM shared with background jobs, run it as ``chrt -f 5 .venv/bin/python ...`` (SCHED_FIFO, root)
so that other processes do not preempt the two OpenMP threads mid-GEMM.

Every configuration times one forward over a context of ``--ctx`` tokens (prefilled before timing,
rewound after each step); configurations alternate inside each repetition so that machine noise
hits all of them alike, and the table reports medians. HF runs the same weights (the converted
embedded model) with a ``DynamicCache`` cropped back after each step.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable

import torch

from specdec_cli.models import load_model
from specdec_cli.models import fast_linear
from specdec_cli.models.fast_linear import onednn_available
from specdec_cli.models.loading import EMBEDDED_NAME, cached_gguf_dir, embedded_model_path

VERIFY_SIZES = (2, 5, 9, 17)
BATCH = 8
TEXT = (
    "Speculative decoding lets a small draft propose several tokens that the large target model then "
    "checks in a single forward pass. When the draft is right, several tokens are produced for the price "
    "of one target step; when it is wrong, the rejected tokens are dropped from the key-value cache and "
    "the target's own token is used instead, so the output distribution is unchanged. "
)


def omp_wait_policy() -> str:
    """OMP_WAIT_POLICY as libgomp saw it when torch loaded (the start environment, before
    ``specdec_cli`` sets its default)."""
    for entry in Path("/proc/self/environ").read_bytes().split(b"\0"):
        if entry.startswith(b"OMP_WAIT_POLICY="):
            return entry.split(b"=", 1)[1].decode()
    return "unset (libgomp default: spin, then sleep)"


def machine() -> str:
    """CPU model, core count and vector extensions, one line."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        name = next(line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        name = platform.processor() or "unknown CPU"
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    amx = " + AMX" if "amx_tile" in flags else ""
    return (
        f"{name}, {torch.get_num_threads()} threads, {isa}{amx}, torch {torch.__version__}, "
        f"OMP_WAIT_POLICY {omp_wait_policy()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--ctx", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results_model.md"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)

    start = time.perf_counter()
    model, tokenizer = load_model(None)  # the first call also imports transformers
    load_first = time.perf_counter() - start
    start = time.perf_counter()
    load_model(None)
    load_again = time.perf_counter() - start

    from transformers import AutoModelForCausalLM, DynamicCache

    directory = cached_gguf_dir(embedded_model_path(), name=EMBEDDED_NAME)
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids = torch.tensor(tokenizer(TEXT * 16)["input_ids"][: args.ctx])
    ctx, max_new = len(ids), max(VERIFY_SIZES)
    vocab = model.arch.vocab_size

    cache = model.new_cache(BATCH, ctx + max_new)
    hf_cache = DynamicCache()
    hf_batch_cache = DynamicCache()
    with torch.inference_mode():
        model(cache, list(range(BATCH)), [ids] * BATCH, logits_for="last")
        hf(ids[None], cache=hf_cache, use_cache=True)
        hf(ids[None].expand(BATCH, -1), cache=hf_batch_cache, use_cache=True)

    def ours(n: int, batch: int = 1) -> float:
        new = torch.randint(0, vocab, (batch, n))
        start = time.perf_counter()
        model(cache, list(range(batch)), list(new), logits_for="all")
        elapsed = time.perf_counter() - start
        for slot in range(batch):
            cache.rewind(slot, ctx)
        return elapsed

    def ours_without_row_kernel(n: int, row_invariant: bool) -> float:
        """Single rows padded to 2 for oneDNN (row_invariant) or through MKL's GEMV (not row-invariant)."""
        fast_linear.USE_ROW_KERNEL, model.row_invariant = False, row_invariant
        try:
            return ours(n)
        finally:
            fast_linear.USE_ROW_KERNEL, model.row_invariant = True, True

    def theirs(n: int, batch: int = 1) -> float:
        kv = hf_cache if batch == 1 else hf_batch_cache
        new = torch.randint(0, vocab, (batch, n))
        start = time.perf_counter()
        hf(new, cache=kv, use_cache=True)
        elapsed = time.perf_counter() - start
        kv.crop(-n)
        return elapsed

    configs: dict[str, Callable[[], float]] = {}
    for n in (1, *VERIFY_SIZES):
        configs[f"ours n={n}"] = lambda n=n: ours(n)
        configs[f"hf n={n}"] = lambda n=n: theirs(n)
    configs["ours n=1 padded"] = lambda: ours_without_row_kernel(1, row_invariant=True)
    configs["ours n=1 mkl"] = lambda: ours_without_row_kernel(1, row_invariant=False)
    configs[f"ours batch{BATCH} n=1"] = lambda: ours(1, BATCH)
    configs[f"hf batch{BATCH} n=1"] = lambda: theirs(1, BATCH)
    configs[f"ours batch{BATCH} n=5"] = lambda: ours(5, BATCH)

    times: dict[str, list[float]] = {name: [] for name in configs}
    with torch.inference_mode():
        for fn in configs.values():  # warm-up (oneDNN packing, allocator)
            fn()
        for _ in range(args.reps):
            for name, fn in configs.items():
                times[name].append(fn())
        invariance = verify_vs_decode_max_diff(model, ids)
    med = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    report = render(med, times, args, machine(), ctx, invariance, (load_first, load_again))
    args.out.write_text(report)
    print(report)


def verify_vs_decode_max_diff(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """Max |logit difference| between a 17-token verify and 17 single-token decodes."""
    drafts = ids[:17].flip(0)
    cache = model.new_cache(1, len(ids) + 17)
    model(cache, [0], ids)
    verify = model(cache, [0], drafts).logits
    cache.rewind(0, len(ids))
    decode = torch.cat([model(cache, [0], drafts[i : i + 1]).logits for i in range(len(drafts))])
    return (verify - decode).abs().max().item()


def _prefix() -> str:
    """The ``chrt`` prefix this process runs under, if any."""
    if os.sched_getscheduler(0) != os.SCHED_FIFO:
        return ""
    return f"chrt -f {os.sched_getparam(0).sched_priority} "


def render(
    med: dict[str, float],
    times: dict[str, list[float]],
    args: argparse.Namespace,
    cpu: str,
    ctx: int,
    invariance: float,
    load_s: tuple[float, float],
) -> str:
    def spread(name: str) -> str:
        q = statistics.quantiles([t * 1e3 for t in times[name]], n=4)
        return f"{q[0]:.1f}–{q[2]:.1f}"

    decode = med["ours n=1"]
    rows = [
        "| tokens per request (K+1) | ours ms (IQR) | ours / ours decode | HF ms (IQR) | HF / HF decode | ours / HF |",
        "|---|---|---|---|---|---|",
    ]
    for n in (1, *VERIFY_SIZES):
        o, h = med[f"ours n={n}"], med[f"hf n={n}"]
        rows.append(
            f"| {n} | {o:.1f} ({spread(f'ours n={n}')}) | {o / decode:.2f} | {h:.1f} ({spread(f'hf n={n}')}) "
            f"| {h / med['hf n=1']:.2f} | {o / h:.2f} |"
        )
    padded, mkl = med["ours n=1 padded"], med["ours n=1 mkl"]
    b_ours, b_hf, b_ver = med[f"ours batch{BATCH} n=1"], med[f"hf batch{BATCH} n=1"], med[f"ours batch{BATCH} n=5"]
    return "\n".join(
        [
            "# Target model runtime: decode and verify latency (embedded SmolLM2-135M-Instruct, fp32)",
            "",
            f"- Machine: {cpu}; oneDNN prepacked linears: {'on' if onednn_available() else 'OFF'}.",
            f"- Command: `{_prefix()}.venv/bin/python benchmarks/bench_model.py --reps {args.reps} --ctx {args.ctx}`",
            f"- Context {ctx} tokens; {args.reps} alternating repetitions; medians (interquartile range) in ms.",
            "- HF: transformers `LlamaForCausalLM` (sdpa) on the same weights with a `DynamicCache`.",
            "- `ours / ours decode` is the cost of verifying K+1 tokens in decode steps (target: <= 1.6 at K+1 = 5);",
            "  `ours / HF` below 1 means faster than HF. Ours runs with `row_invariant=True` (the default):",
            "  up to `row_gemv.MAX_ROWS` rows (16 with AVX-512, else 2) take the `row_gemv` kernel (oneDNN's rounding"
            " order), more rows oneDNN's GEMM.",
            "",
            "## Batch 1",
            "",
            *rows,
            "",
            "Decode without the row kernel:",
            f"- padded to 2 rows for oneDNN (row-invariant, the path before `row_gemv`): {padded:.1f} ms "
            f"({spread('ours n=1 padded')}), {padded / decode:.2f}x the default decode, {padded / med['hf n=1']:.2f}x HF;",
            f"- MKL's GEMV (`row_invariant=False`; logits then differ from a verify's by fp32 rounding): {mkl:.1f} ms "
            f"({spread('ours n=1 mkl')}), {mkl / decode:.2f}x the default decode, {mkl / med['hf n=1']:.2f}x HF.",
            "",
            f"## Batch {BATCH}",
            "",
            "| config | ours ms | HF ms | ours tok/s | HF tok/s |",
            "|---|---|---|---|---|",
            f"| decode (1 token per request) | {b_ours:.1f} | {b_hf:.1f} | {BATCH * 1e3 / b_ours:.0f} "
            f"| {BATCH * 1e3 / b_hf:.0f} |",
            f"| verify 5 per request | {b_ver:.1f} | – | {b_ver / b_ours:.2f}x decode | – |",
            "",
            "## Row invariance",
            "",
            f"Max |logit difference| between one 17-token verify and 17 single-token decodes: {invariance:.3g}"
            + (" (bitwise identical)." if invariance == 0 else "."),
            "",
            "## Loading",
            "",
            f"`load_model(None)` from the safetensors cache: {load_s[0]:.2f} s for the first call in a fresh process "
            f"(includes importing transformers), {load_s[1]:.2f} s for a second call.",
            "",
        ]
    )


if __name__ == "__main__":
    main()
