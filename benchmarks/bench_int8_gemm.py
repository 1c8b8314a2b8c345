"""Weight-only int8 GEMMs of the embedded target (SmolLM2-135M) for few rows: our kernel vs ATen's, and fp32.

    chrt -f 5 .venv/bin/python benchmarks/bench_int8_gemm.py [--rows 1,2,5,8,13,16,32] [--reps 7]
        [--out benchmarks/results_int8_gemm.md]

One "pass" is every linear of one forward: 30 layers x (fused q/k/v, o, fused gate/up, down) + the LM head,
random weights of those shapes, activations random. Timed per row count, best of ``--reps``, interleaved:
- ``Int8Linear`` (specdec's weight-only int8: ``row_gemv``'s kernel fed int8 weights, float32 activations,
  chunks of ``row_gemv.MAX_ROWS`` rows), module call included;
- ATen's ``torch._weight_int8pack_mm`` (the kernel ``model.dtype=int8`` used before; bf16 activations);
- the float32 ``Linear`` (``row_gemv`` for up to MAX_ROWS rows where its probe matched, else oneDNN).
Weights are read from memory each pass (135 MB int8 / 540 MB fp32, far beyond the caches).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bench_model import machine
from specdec_cli.models.fast_linear import Linear
from specdec_cli.models.quantize import Int8Linear, quantize_weight

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def best_ms(function, reps: int) -> float:
    function()  # compile / pack
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,5,8,13,16,32")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results_int8_gemm.md"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    ours, aten, fp32 = [], [], []
    for out_features, in_features in SHAPES:
        weight = torch.randn(out_features, in_features, generator=generator) * 0.02
        qweight, scale = quantize_weight(weight)
        ours.append(Int8Linear(qweight, scale, None))
        aten.append((qweight, scale.to(torch.bfloat16)))
        linear = Linear(in_features, out_features)
        with torch.no_grad():
            linear.weight.copy_(weight)
        fp32.append(linear)
    rows_list = [int(r) for r in args.rows.split(",")]
    table = []
    with torch.inference_mode():
        for rows in rows_list:
            inputs = {k: torch.randn(rows, k, generator=generator) for k in (576, 1536)}
            bf16 = {k: x.to(torch.bfloat16) for k, x in inputs.items()}
            cases = {
                "ours": lambda: [lin(inputs[lin.in_features]) for lin in ours],
                "aten": lambda: [torch._weight_int8pack_mm(bf16[q.shape[1]], q, s) for q, s in aten],
                "fp32": lambda: [lin(inputs[lin.in_features]) for lin in fp32],
            }
            times = {name: best_ms(case, args.reps) for name, case in cases.items()}
            table.append((rows, times))
            print(rows, {k: f"{v:.1f} ms" for k, v in times.items()}, flush=True)
    lines = [
        "# Weight-only int8 GEMMs for few rows (`benchmarks/bench_int8_gemm.py`)",
        "",
        f"- Command: `python benchmarks/bench_int8_gemm.py --rows {args.rows} --reps {args.reps} "
        f"--threads {args.threads}`; {machine()}",
        "- One pass = every linear of one SmolLM2-135M forward (121 GEMMs, random weights of those shapes), "
        "best of the reps; weights from memory.",
        "",
        "| rows | specdec int8 (`Int8Linear`) ms | ATen `_weight_int8pack_mm` (bf16 act.) ms | float32 `Linear` ms "
        "| int8: ATen / ours | float32 / int8 ours |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for rows, t in table:
        lines.append(f"| {rows} | {t['ours']:.1f} | {t['aten']:.1f} | {t['fp32']:.1f} | "
                     f"{t['aten'] / t['ours']:.2f}x | {t['fp32'] / t['ours']:.2f}x |")
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
