"""Stage 1 of self-distillation: the target answers generated prompts; token streams are kept.

Two corpora share the shard format: v1 (this module: the built-in templates) and v2
(``train/corpus/``: task families, self-written instructions, greedy and T=1 answers).
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

from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.workload import encode_prompt
from specdec_cli.models import Transformer
from specdec_cli.files import atomic_write_json
from specdec_cli.train.corpus.shards import load_corpus, run_engine, save_shard  # load_corpus: for the pipeline
from specdec_cli.train.prompts import distill_prompts, is_held_out

_save_shard = save_shard  # the name the training tests import


@dataclass(frozen=True)
class CorpusSpec:
    num_prompts: int = 4096
    shard_size: int = 64
    batch_size: int = 32
    max_new_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.9
    seed: int = 0


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
        shard_start = time.perf_counter()
        run_engine(target, requests, spec.batch_size)
        save_shard(path, [r.prompt_token_ids for r in requests], [r.output_token_ids for r in requests],
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
    """``python -m specdec_cli.train.data --out DIR [--corpus v2]``: generate (or resume) a corpus for the
    embedded target; rerunning the same command continues with the first missing shard."""
    import argparse

    import torch

    from specdec_cli.models import load_model

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--corpus", choices=("v1", "v2"), default="v1",
                        help="v1: the built-in templates; v2: task families, greedy and T=1 answers")
    parser.add_argument("--model", default=None, help="HF dir / GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--num-prompts", type=int, default=CorpusSpec.num_prompts, help="v1 only")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--target-tokens", type=int, default=None, help="v2: stop at this many response tokens")
    parser.add_argument("--families", default=None,
                        help="v2: comma-separated task families in schedule order (default: the v2 corpus's ten)")
    parser.add_argument("--held-out-families", default=None,
                        help="v2: comma-separated families held out whole ('' for none; default: translate,arithmetic)")
    parser.add_argument("--time-budget-s", type=float, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads or max(1, torch.get_num_threads()))
    target, tokenizer = load_model(args.model)
    say = lambda line: print(line, flush=True)  # noqa: E731
    sizes = {k: v for k, v in (("max_new_tokens", args.max_new_tokens), ("batch_size", args.batch_size))
             if v is not None}
    if args.corpus == "v1":
        spec = CorpusSpec(num_prompts=args.num_prompts, **sizes)
        generate_corpus(target, tokenizer, args.out, spec, time_budget_s=args.time_budget_s, log=say)
        return
    from specdec_cli.train.corpus.families import BUILDERS, MAGPIE
    from specdec_cli.train.corpus.generate import CorpusV2Spec, default_sources, generate_corpus_v2

    if args.target_tokens is not None:
        sizes["target_tokens"] = args.target_tokens
    for key, value in (("families", args.families), ("held_out_families", args.held_out_families)):
        if value is not None:
            sizes[key] = tuple(name for name in value.split(",") if name)
    unknown = set(sizes.get("families", ())) - set(BUILDERS) - {MAGPIE}
    if unknown:
        parser.error(f"unknown families: {', '.join(sorted(unknown))} (known: {', '.join((MAGPIE, *BUILDERS))})")
    spec = CorpusV2Spec(**sizes)
    sources = default_sources(tokenizer, spec)
    say(f"sources: {len(sources.passages)} passages, {len(sources.snippets)} code snippets")
    generate_corpus_v2(target, tokenizer, args.out, spec, sources, time_budget_s=args.time_budget_s, log=say)


if __name__ == "__main__":
    main()
