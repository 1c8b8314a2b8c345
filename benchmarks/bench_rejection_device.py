"""Rejection kernel timing on a device: torch vs flashinfer (where importable), same inputs, ratios from one run.

usage: bench_rejection_device.py --device cuda [--batch 16 --k 4 --vocab 49152 --rounds 20] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from specdec_cli.sampling.backend import rejection_sample_with


def timed(device: torch.device, fn, rounds: int) -> float:
    """Median seconds of ``fn()`` over ``rounds`` (synchronised on CUDA)."""
    fn()
    samples = []
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        samples.append(time.perf_counter() - start)
    return sorted(samples)[len(samples) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    target = torch.rand(args.batch, args.k + 1, args.vocab, generator=gen, device=device).softmax(-1)
    draft = torch.rand(args.batch, args.k, args.vocab, generator=gen, device=device).softmax(-1)
    tokens = torch.randint(args.vocab, (args.batch, args.k), generator=gen, device=device)
    seeded = [torch.Generator(device=device).manual_seed(i) if i % 2 else None for i in range(args.batch)]
    rows = [f"| torch | {timed(device, lambda: rejection_sample_with('torch', target, draft, tokens, generators=seeded), args.rounds) * 1e3:.3f} |"]
    try:
        import flashinfer  # noqa: F401
        ms = timed(device, lambda: rejection_sample_with("flashinfer", target, draft, tokens, generators=seeded), args.rounds)
        rows.append(f"| flashinfer | {ms * 1e3:.3f} |")
    except Exception as err:  # not installed / no CUDA: say so in the report
        rows.append(f"| flashinfer | unavailable ({type(err).__name__}: {err}) |")
    report = "\n".join([f"rejection kernel, {device}, B={args.batch} K={args.k} V={args.vocab} (half the rows seeded)",
                        "", "| backend | median ms |", "|---|---|", *rows, ""])
    print(report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
