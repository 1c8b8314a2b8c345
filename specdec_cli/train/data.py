"""Stage 1 of self-distillation: the target answers generated prompts; token streams are kept.

Responses are generated with the project's own engine (``method=none``, batched, sampled
with the chat template) and stored compactly as uint16 ids in shards of
``shard_size`` prompts (``shard_00000.npz`` ...), written atomically, so generation resumes
where it stopped and the corpus can be committed and shared by every drafter. Hidden
states are recomputed from these streams at training time, never stored.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.runner import run_requests
from specdec_cli.engine.workload import encode_prompt
from specdec_cli.models import Transformer
from specdec_cli.files import atomic_write_json
from specdec_cli.train.prompts import distill_prompts, is_held_out


@dataclass(frozen=True)
class CorpusSpec:
    num_prompts: int = 4096
    shard_size: int = 64
    batch_size: int = 32
    max_new_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.9
    seed: int = 0


def _save_shard(path: Path, prompts: list[list[int]], responses: list[list[int]], held_out: list[bool]) -> None:
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(
        tmp,
        prompt_ids=np.array([t for p in prompts for t in p], dtype=np.uint16),
        prompt_lens=np.array([len(p) for p in prompts], dtype=np.int32),
        response_ids=np.array([t for r in responses for t in r], dtype=np.uint16),
        response_lens=np.array([len(r) for r in responses], dtype=np.int32),
        held_out=np.array(held_out, dtype=bool),
    )
    tmp.replace(path)


def load_corpus(directory: Path, *, held_out: Optional[bool] = None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) pairs from every shard; filter by held-out membership."""
    pairs = []
    for path in sorted(directory.glob("shard_*.npz")):
        data = np.load(path)
        prompts = np.split(data["prompt_ids"].astype(np.int64), np.cumsum(data["prompt_lens"])[:-1])
        responses = np.split(data["response_ids"].astype(np.int64), np.cumsum(data["response_lens"])[:-1])
        for prompt, response, flag in zip(prompts, responses, data["held_out"]):
            if held_out is None or bool(flag) == held_out:
                pairs.append((prompt.tolist(), response.tolist()))
    return pairs


def generate_corpus(target: Transformer, tokenizer, out_dir: Path, spec: CorpusSpec, *,
                    time_budget_s: Optional[float] = None, log: Callable[[str], None] = print) -> int:
    """Generate missing shards into ``out_dir`` (resumable); returns the number of new shards."""
    if target.arch.vocab_size > np.iinfo(np.uint16).max + 1:
        raise ValueError("uint16 token storage needs a vocabulary of at most 65536 ids")
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "spec.json", asdict(spec))
    prompts = distill_prompts(spec.num_prompts, spec.seed)
    eos = tuple(t for t in {tokenizer.eos_token_id} if t is not None)
    start, written = time.perf_counter(), 0
    for first in range(0, len(prompts), spec.shard_size):
        path = out_dir / f"shard_{first // spec.shard_size:05d}.npz"
        if path.exists():
            continue
        if time_budget_s is not None and time.perf_counter() - start > time_budget_s:
            break
        texts = prompts[first : first + spec.shard_size]
        requests = [
            Request(id=str(first + i), prompt=text, prompt_token_ids=encode_prompt(tokenizer, text, chat=True),
                    params=SamplingParams(spec.temperature, 0, spec.top_p, seed=spec.seed * 1_000_003 + first + i),
                    max_new_tokens=spec.max_new_tokens, eos_token_ids=eos)
            for i, text in enumerate(texts)
        ]
        max_len = max(len(r.prompt_token_ids) for r in requests) + spec.max_new_tokens
        engine = SpecEngine(target, None, EngineOptions(max_batch_size=spec.batch_size, max_seq_len=max_len))
        shard_start = time.perf_counter()
        run_requests(engine, requests)
        _save_shard(path, [r.prompt_token_ids for r in requests], [r.output_token_ids for r in requests],
                    [is_held_out(t) for t in texts])
        tokens = sum(len(r.output_token_ids) for r in requests)
        written += 1
        log(f"{path.name}: {tokens} tokens in {time.perf_counter() - shard_start:.0f} s "
            f"({tokens / (time.perf_counter() - shard_start):.1f} tok/s)")
    _write_manifest(out_dir)
    return written


def _write_manifest(out_dir: Path) -> None:
    shards = sorted(out_dir.glob("shard_*.npz"))
    counts = {"train": 0, "held_out": 0}
    for path in shards:
        data = np.load(path)
        for length, flag in zip(data["response_lens"], data["held_out"]):
            counts["held_out" if flag else "train"] += int(length)
    atomic_write_json(out_dir / "manifest.json", {
        "shards": len(shards), "response_tokens": counts,
        "note": "target-generated responses (uint16 ids); see spec.json for the generation settings",
    })


def main() -> None:
    """``python -m specdec_cli.train.data --out DIR``: generate (or resume) the corpus for the embedded target."""
    import argparse

    import torch

    from specdec_cli.models import load_model

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default=None, help="HF dir / GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--num-prompts", type=int, default=CorpusSpec.num_prompts)
    parser.add_argument("--max-new-tokens", type=int, default=CorpusSpec.max_new_tokens)
    parser.add_argument("--batch-size", type=int, default=CorpusSpec.batch_size)
    parser.add_argument("--time-budget-s", type=float, default=None)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    target, tokenizer = load_model(args.model)
    spec = CorpusSpec(num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    generate_corpus(target, tokenizer, args.out, spec, time_budget_s=args.time_budget_s,
                    log=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
