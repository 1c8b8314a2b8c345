"""Rejection-sampling kernel vs the per-row float64 reference and HF transformers, on the same inputs.

    .venv/bin/python benchmarks/bench_sampling.py [--rounds 7] [--threads 2] [--out benchmarks/results_sampling.md]

All configurations are timed in interleaved rounds (every implementation, every configuration, then the
next round) and reported as medians, so the ratios come from one run under the same machine load.
Bytes per call = the target and draft rows the recovery step must read, 2 * B * V * 4; they are compared
with the read bandwidth of this machine measured here (a sum over a tensor far larger than the caches).
OpenMP threads wait passively unless OMP_WAIT_POLICY says otherwise: on a shared machine, spinning
threads of a 2-thread pool slow small operators down by 10-100x and drown every ratio in noise.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # must precede the OpenMP start-up in `import torch`

import torch  # noqa: E402

from specdec_cli.sampling import rejection_sample, rejection_sample_reference  # noqa: E402

try:
    from transformers.generation.utils import _speculative_sampling as hf_speculative_sampling  # noqa: E402
except ImportError:  # the private helper moved or disappeared in this transformers version
    hf_speculative_sampling = None

BATCHES, DRAFT_LENGTHS, VOCABS = (1, 8, 64), (4, 8), (32_000, 49_152, 128_256)  # 49152: SmolLM2


@dataclass
class Case:
    """One configuration's inputs: target_probs [B, K+1, V], draft_probs [B, K, V], drafts, uniforms."""

    batch: int
    k: int
    vocab: int
    target_probs: torch.Tensor
    draft_probs: torch.Tensor
    draft_tokens: torch.Tensor
    uniforms: torch.Tensor

    @property
    def name(self) -> str:
        return f"B={self.batch} K={self.k} V={self.vocab}"


def make_case(batch: int, k: int, vocab: int, generator: torch.Generator) -> Case:
    """Peaked target rows and draft rows close to them, so that about 70% of drafts are accepted."""
    logits = 3 * torch.randn(batch, k + 1, vocab, generator=generator)
    target_probs = logits.softmax(-1)
    draft_probs = (logits[:, :k] + 0.6 * torch.randn(batch, k, vocab, generator=generator)).softmax(-1)
    draft_tokens = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=generator).view(batch, k)
    uniforms = torch.rand(batch, k + 1, generator=generator, dtype=torch.float64)
    return Case(batch, k, vocab, target_probs, draft_probs, draft_tokens, uniforms)


def hf_per_row(case: Case, target_logits: torch.Tensor, draft_logits: torch.Tensor) -> None:
    """HF's helper is batch-1 and takes logits: one call per row (as HF assisted generation runs)."""
    for b in range(case.batch):
        hf_speculative_sampling(case.draft_tokens[b : b + 1], draft_logits[b : b + 1], case.k, target_logits[b : b + 1])


def measure_read_bandwidth(gib: float = 1.0, repeats: int = 5) -> tuple[float, float]:
    """(read GB/s from a sum, copy GB/s counting read + write) over a tensor of `gib` GiB."""
    source = torch.ones(int(gib * 2**30) // 4)
    target = torch.empty_like(source)
    reads, copies = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        source.sum()
        reads.append(source.numel() * 4 / (time.perf_counter() - start) / 1e9)
        start = time.perf_counter()
        target.copy_(source)
        copies.append(2 * source.numel() * 4 / (time.perf_counter() - start) / 1e9)
    return statistics.median(reads), statistics.median(copies)


def run(rounds: int) -> tuple[list[dict], tuple[float, float]]:
    bandwidth = measure_read_bandwidth()
    generator = torch.Generator().manual_seed(0)
    cases = [make_case(b, k, v, generator) for v in VOCABS for k in DRAFT_LENGTHS for b in BATCHES]
    hf_inputs = {c.name: (c.target_probs.log(), c.draft_probs.log()) for c in cases}
    implementations: dict[str, Callable[[Case], object]] = {
        "ours": lambda c: rejection_sample(c.target_probs, c.draft_probs, c.draft_tokens, uniforms=c.uniforms),
        "reference": lambda c: rejection_sample_reference(c.target_probs, c.draft_probs, c.draft_tokens, c.uniforms),
    }
    if hf_speculative_sampling is not None:
        implementations["hf"] = lambda c: hf_per_row(c, *hf_inputs[c.name])
    times: dict[tuple[str, str], list[float]] = {(c.name, i): [] for c in cases for i in implementations}
    for case in cases:  # warm-up, and the exactness check: identical uniforms -> identical tokens
        ours, reference = implementations["ours"](case), implementations["reference"](case)
        assert all(torch.equal(a, b) for a, b in zip(ours, reference)), case.name
    for _ in range(rounds):
        for case in cases:
            for impl, function in implementations.items():
                start = time.perf_counter()
                function(case)
                times[(case.name, impl)].append(time.perf_counter() - start)
    rows = []
    for case in cases:
        median = {impl: statistics.median(times[(case.name, impl)]) for impl in implementations}
        emitted = rejection_sample(case.target_probs, case.draft_probs, case.draft_tokens, uniforms=case.uniforms)[1]
        rows.append(
            dict(
                case=case,
                median=median,
                gbps=2 * case.batch * case.vocab * 4 / median["ours"] / 1e9,
                emitted=float(emitted.float().mean()),
            )
        )
    return rows, bandwidth


def report(rows: list[dict], bandwidth: tuple[float, float], rounds: int, command: str) -> str:
    read_bw, copy_bw = bandwidth
    has_hf = "hf" in rows[0]["median"]
    lines = [
        "# Rejection-sampling benchmark",
        "",
        f"- Machine: {_machine()}",
        f"- Command: `{command}` ({rounds} interleaved rounds, medians; "
        f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']})",
        f"- Measured memory bandwidth (1 GiB tensor): read (sum) {read_bw:.1f} GB/s, "
        f"copy (read + write) {copy_bw:.1f} GB/s",
        "- ours = `rejection_sample` (torch, CPU); reference = `rejection_sample_reference` (float64, per row);"
        " hf = `transformers.generation.utils._speculative_sampling`"
        + ("" if has_hf else " (not present in this transformers version)"),
        "- ours and the reference consume the same uniforms and returned identical tokens in every configuration.",
        "",
        "| B | K | V | ours ms | reference ms | hf ms | reference / ours | hf / ours | ours GB/s | % of read BW "
        "| tokens/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        case, median = row["case"], row["median"]
        hf_ms = f"{median['hf'] * 1e3:.2f}" if has_hf else "n/a"
        hf_ratio = f"{median['hf'] / median['ours']:.1f}x" if has_hf else "n/a"
        lines.append(
            f"| {case.batch} | {case.k} | {case.vocab} | {median['ours'] * 1e3:.2f} | "
            f"{median['reference'] * 1e3:.2f} | "
            f"{hf_ms} | {median['reference'] / median['ours']:.1f}x | {hf_ratio} | {row['gbps']:.1f} | "
            f"{100 * row['gbps'] / read_bw:.0f}% | {row['emitted']:.2f} |"
        )
    lines += [
        "",
        "Columns: times are medians per call; GB/s counts the 2 * B * V * 4 bytes of the target and draft rows the",
        "recovery step must read (the K acceptance tests read only B * K entries); tokens/step is the mean",
        "num_emitted. hf is batch-1 only, so it is called once per row, and it takes logits (log of the same",
        "probabilities), so its time includes two softmaxes; it accepts with `r <= p / q` and samples with",
        "torch.multinomial.",
    ]
    return "\n".join(lines) + "\n"


def _machine() -> str:
    """CPU model, CPU count, torch version and threads, load average (Linux; 'unknown' elsewhere)."""
    model, load = "unknown CPU", "unknown"
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
        load = open("/proc/loadavg").read().split()[0]
    except (OSError, StopIteration):
        pass
    return (
        f"{model}, {os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} threads, "
        f"load average {load} at the end of the run"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows, bandwidth = run(args.rounds)
    command = f"python benchmarks/bench_sampling.py --rounds {args.rounds} --threads {args.threads}"
    command += f" --out {args.out}" if args.out else ""
    text = report(rows, bandwidth, args.rounds, command)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
