"""Learned drafters (EAGLE-3, MTP, draft_target, PARD, DFlash) vs autoregressive on the embedded default.

Usage: chrt -f 5 .venv/bin/python benchmarks/bench_learned.py [--prompts 8] [--max-new 64]
           [--ks 2 4 6 8] [--methods eagle3 mtp draft_target pard dflash]
           [--checkpoint eagle3=DIR ...] [--out benchmarks/results_learned.md] [--record]

Protocol (issues "Learned drafters I/II"): MT-Bench first turns (never trained on), chat template,
batch 1, K draft tokens, greedy and temperature 1, the shipped drafts unless ``--checkpoint`` names
another. Every configuration runs on every prompt, configurations alternate inside each prompt, and
tokens/s is total tokens over total time per configuration, so each speed-up over ``none`` is a
ratio from one run. Writes the markdown table, a JSON of every number (``--out`` with ``.json``) and
a plot of acceptance length and speed-up against K (``.png``). ``--record`` also writes each shipped
draft's numbers into the ``measured`` field of its ``manifest.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec_cli.config.schema import (
    DflashMethodConfig,
    DraftTargetMethodConfig,
    Eagle3MethodConfig,
    MethodConfig,
    MtpMethodConfig,
    NoneMethodConfig,
    PardMethodConfig,
    WorkloadConfig,
)
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.drafters.learned import ASSETS, SHIPPED_TARGET
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.workload import encode_prompt, load_prompts
from specdec_cli.models import load_model
from specdec_cli.run.drive import run_requests

METHODS = {"eagle3": Eagle3MethodConfig, "mtp": MtpMethodConfig, "draft_target": DraftTargetMethodConfig,
           "pard": PardMethodConfig, "dflash": DflashMethodConfig}
MAX_SEQ_LEN = 1024


@dataclass
class Config:
    """One (method, K) engine and its totals per temperature."""

    method: str
    k: int
    engine: SpecEngine
    tokens: dict[float, int] = field(default_factory=lambda: {0.0: 0, 1.0: 0})
    seconds: dict[float, float] = field(default_factory=lambda: {0.0: 0.0, 1.0: 0.0})
    stats: dict[float, dict] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.method if self.method == "none" else f"{self.method} K={self.k}"


def method_config(method: str, k: int, checkpoints: dict[str, str]) -> MethodConfig:
    if method == "none":
        return NoneMethodConfig()
    cfg = METHODS[method](num_draft_tokens=k)
    if method in checkpoints:
        setattr(cfg, "draft_path" if method == "draft_target" else "checkpoint", checkpoints[method])
    return cfg


def run_one(config: Config, tokenizer, prompt_ids: list[int], temperature: float, max_new: int, seed: int) -> None:
    """Generate one request; add its tokens and time to ``config``'s totals for ``temperature``."""
    engine = config.engine
    engine.stats = type(engine.stats)()  # per-temperature statistics are kept apart below
    request = Request(id="0", prompt_token_ids=prompt_ids, params=SamplingParams(temperature, seed=seed),
                      max_new_tokens=max_new, eos_token_ids=(tokenizer.eos_token_id,))
    start = time.perf_counter()
    run_requests(engine, [request])
    config.seconds[temperature] += time.perf_counter() - start
    config.tokens[temperature] += len(request.output_token_ids)
    merged = config.stats.setdefault(temperature, {"steps": 0, "emitted": 0, "proposed_at": [], "accepted_at": []})
    merged["steps"] += engine.stats.verify_steps
    merged["emitted"] += engine.stats.emitted_tokens
    for key in ("proposed_at", "accepted_at"):
        values = getattr(engine.stats, key)
        merged[key] += [0] * (len(values) - len(merged[key]))
        for i, v in enumerate(values):
            merged[key][i] += v


def results(configs: list[Config]) -> list[dict]:
    rows = []
    for temperature in (0.0, 1.0):
        base = next(c for c in configs if c.method == "none")
        base_speed = base.tokens[temperature] / base.seconds[temperature]
        for c in configs:
            s = c.stats[temperature]
            speed = c.tokens[temperature] / c.seconds[temperature]
            rows.append({
                "method": c.method, "k": c.k, "temperature": temperature, "tokens": c.tokens[temperature],
                "seconds": round(c.seconds[temperature], 2), "tokens_per_s": round(speed, 2),
                "speedup": round(speed / base_speed, 3),
                "acceptance_length": round(s["emitted"] / s["steps"], 3) if s["steps"] else 1.0,
                "per_position": [round(a / p, 3) for a, p in zip(s["accepted_at"], s["proposed_at"])],
            })
    return rows


def sampler_name(temperature: float) -> str:
    return "greedy" if temperature == 0 else "T=1"


def machine() -> str:
    """The machine line recorded with the results."""
    return (f"{platform.machine()}, {os.cpu_count()} vCPUs, torch {torch.__version__}, fp32, batch 1, "
            f"{time.strftime('%Y-%m-%d')}")


def write(args, rows: list[dict]) -> None:
    lines = ["| method | K | sampler | tokens/s | speed-up vs `none` | acceptance length | "
             "per-position acceptance |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        sampler = sampler_name(r["temperature"])
        per = " / ".join(f"{a:.2f}" for a in r["per_position"]) or "-"
        k = "-" if r["method"] == "none" else str(r["k"])
        lines.append(f"| {r['method']} | {k} | {sampler} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | "
                     f"{r['acceptance_length']:.2f} | {per} |")
    command = (f"chrt -f 5 .venv/bin/python benchmarks/bench_learned.py --prompts {args.prompts} "
               f"--max-new {args.max_new} --ks {' '.join(map(str, args.ks))} --methods {' '.join(args.methods)}")
    host = machine()
    text = "\n".join([f"Command: `{command}`", "", f"Machine: {host}", "", *lines, ""])
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, "machine": host, "rows": rows}, indent=1) + "\n")
    plot(rows, args.out.with_suffix(".png"))
    print(text)


def record(args, rows: list[dict], methods: list[str]) -> None:
    """The measured numbers of each method in ``methods`` into its shipped draft's manifest.json."""
    for method in methods:
        path = ASSETS / SHIPPED_TARGET / method / "manifest.json"
        manifest = json.loads(path.read_text())
        measured: dict = {"benchmark": f"{args.out.as_posix()} (MT-Bench first turns, {args.prompts} prompts x "
                                       f"{args.max_new} tokens; {machine()})"}
        for r in rows:
            if r["method"] == method:
                measured[f"K={r['k']} {sampler_name(r['temperature'])}"] = {
                    "acceptance_length": r["acceptance_length"], "speedup_vs_none": r["speedup"],
                    "per_position": r["per_position"]}
        manifest["measured"] = measured
        path.write_text(json.dumps(manifest, indent=2) + "\n")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method in dict.fromkeys(r["method"] for r in rows if r["method"] != "none"):
        for temperature, style in ((0.0, "-o"), (1.0, "--s")):
            picked = [r for r in rows if r["method"] == method and r["temperature"] == temperature]
            label = f"{method} ({sampler_name(temperature)})"
            axes[0].plot([r["k"] for r in picked], [r["acceptance_length"] for r in picked], style, label=label)
            axes[1].plot([r["k"] for r in picked], [r["speedup"] for r in picked], style, label=label)
    axes[0].set(xlabel="K (draft tokens)", ylabel="acceptance length (tokens / verify)", title="acceptance")
    axes[1].axhline(1.0, color="grey", lw=0.8)
    axes[1].set(xlabel="K (draft tokens)", ylabel="speed-up vs autoregressive", title="end-to-end, batch 1, CPU")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6, 8])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--checkpoint", action="append", default=[], help="METHOD=DIR (default: the shipped draft)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results_learned.md"))
    parser.add_argument("--record", action="store_true", help="write the numbers into the shipped manifests")
    args = parser.parse_args()
    torch.set_num_threads(2)
    checkpoints = dict(item.split("=", 1) for item in args.checkpoint)
    model, tokenizer = load_model(None)
    deps = DrafterDeps(model, 1, MAX_SEQ_LEN, model.arch.vocab_size, torch.device("cpu"), torch.float32)
    configs = []
    for method, k in [("none", 0)] + [(m, k) for m in args.methods for k in args.ks]:
        cfg = method_config(method, k, checkpoints)
        drafter = build_drafter(cfg, deps)
        configs.append(Config(method, k, SpecEngine(model, drafter, EngineOptions(
            max_batch_size=1, max_seq_len=MAX_SEQ_LEN, max_draft_len=cfg.num_draft_tokens))))
    prompts = load_prompts(WorkloadConfig(source="mt_bench", num_prompts=args.prompts))
    encoded = [encode_prompt(tokenizer, p.text, chat=True) for p in prompts]
    for index, prompt_ids in enumerate(encoded):
        for temperature in (0.0, 1.0):
            order = configs if index % 2 == 0 else configs[::-1]
            for config in order:
                run_one(config, tokenizer, prompt_ids, temperature, args.max_new, index)
        print(f"prompt {index + 1}/{len(encoded)} done", flush=True)
    rows = results(configs)
    write(args, rows)
    if args.record:
        record(args, rows, [m for m in args.methods if m not in checkpoints])


if __name__ == "__main__":
    main()
