"""Corpus v2: round-robin task-family shards, answered by the target greedy and at T=1.

Shard ``i`` of the schedule holds ``shard_size`` prompts of one family; families take turns
(every family is covered in the first round), held-out families stop after
``eval_shards_per_held_out_family`` rounds, and a family's shards alternate between the
response temperatures. Generation stops at ``target_tokens`` response tokens. Rerunning
continues with the first missing shard; prompts already in a shard are never drawn again.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from itertools import count
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.workload import encode_prompt
from specdec_cli.files import atomic_write_json
from specdec_cli.models import Transformer
from specdec_cli.train.corpus.families import FAMILIES, MAGPIE, Sources, build_prompts
from specdec_cli.train.corpus.magpie import MagpieSettings, self_instructions
from specdec_cli.train.corpus.sources import (code_snippets, file_passages, prose_files, response_passages,
                                              stdlib_files)
from specdec_cli.train.corpus.shards import load_corpus, run_engine, save_shard, shard_families
from specdec_cli.train.prompts import is_held_out


@dataclass(frozen=True)
class CorpusV2Spec:
    families: tuple[str, ...] = FAMILIES
    held_out_families: tuple[str, ...] = ("translate", "arithmetic")  # whole families, for evaluation
    eval_shards_per_held_out_family: int = 4
    row_held_out_share: float = 0.05  # rows of training families held out by a hash of the prompt
    shard_size: int = 32
    batch_size: int = 32
    max_new_tokens: int = 256
    temperatures: tuple[float, ...] = (0.0, 1.0)  # a family's k-th shard answers at temperatures[k % len]
    top_p: float = 1.0
    magpie: MagpieSettings = MagpieSettings()
    target_tokens: int = 1_600_000
    max_shards: int = 4000
    seed: int = 0
    passages_from: str = "data/distill/smollm2_135m"  # a corpus whose decoded responses become passages


def shard_schedule(spec: CorpusV2Spec) -> Iterator[tuple[int, str, int]]:
    """(shard index, family, the family's shard number), families round-robin, up to ``max_shards``."""
    index = 0
    for round_number in count():
        if round_number >= spec.eval_shards_per_held_out_family and set(spec.families) <= set(spec.held_out_families):
            return
        for family in spec.families:
            if family in spec.held_out_families and round_number >= spec.eval_shards_per_held_out_family:
                continue
            if index >= spec.max_shards:
                return
            yield index, family, round_number
            index += 1


def default_sources(tokenizer, spec: CorpusV2Spec) -> Sources:
    """Passages: the target's answers in ``spec.passages_from`` and shipped license prose; stdlib code."""
    directory = Path(spec.passages_from)
    answers = [tokenizer.decode(r, skip_special_tokens=True) for _, r in load_corpus(directory)] \
        if directory.is_dir() else []
    return Sources(passages=tuple(response_passages(answers) + file_passages(prose_files())),
                   snippets=tuple(code_snippets(stdlib_files())))


class _Tally:
    """Response tokens per family and split, the prompts already used, kept in step with the shards."""

    def __init__(self, out_dir: Path) -> None:
        self.tokens: dict[str, dict[str, int]] = {}
        self.seen: set[tuple[int, ...]] = set()
        for path in sorted(out_dir.glob("shard_*.npz")):
            data = np.load(path)
            prompts = np.split(data["prompt_ids"], np.cumsum(data["prompt_lens"])[:-1])
            self.seen.update(tuple(p.tolist()) for p in prompts[: len(data["prompt_lens"])])
            for family, length, flag in zip(shard_families(data), data["response_lens"], data["held_out"]):
                self.add(str(family), int(length), bool(flag))
        self.shards = len(list(out_dir.glob("shard_*.npz")))

    def add(self, family: str, length: int, held_out: bool) -> None:
        split = self.tokens.setdefault(family, {"train": 0, "held_out": 0})
        split["held_out" if held_out else "train"] += length

    @property
    def total(self) -> int:
        return sum(sum(split.values()) for split in self.tokens.values())

    def manifest(self) -> dict:
        return {"shards": self.shards, "response_tokens": self.total, "response_tokens_by_family": self.tokens,
                "note": "target-generated responses (uint16 ids); family and temperature per row; see spec.json"}


def _check_spec(out_dir: Path, spec: CorpusV2Spec) -> None:
    """Write spec.json, or refuse to resume a directory generated with other settings."""
    settings = json.loads(json.dumps(asdict(spec)))
    path = out_dir / "spec.json"
    if path.exists() and json.loads(path.read_text()) != settings:
        raise ValueError(f"{path}: the corpus was generated with other settings; use another --out")
    atomic_write_json(path, settings)


def _prompts(family: str, number: int, target: Transformer, tokenizer, spec: CorpusV2Spec, sources: Sources,
             accept: Callable[[str], bool]) -> list[str]:
    seed = spec.seed * 1_000_003 + spec.families.index(family) * 10_007 + number
    if family == MAGPIE:
        return self_instructions(target, tokenizer, spec.shard_size, seed=seed, batch_size=spec.batch_size,
                                 accept=accept, settings=spec.magpie)
    return build_prompts(family, spec.shard_size, random.Random(f"{spec.seed}/{family}/{number}"), sources, accept)


def generate_corpus_v2(target: Transformer, tokenizer, out_dir: Path, spec: CorpusV2Spec, sources: Sources, *,
                       time_budget_s: Optional[float] = None, log: Callable[[str], None] = print) -> int:
    """Generate the missing shards of the schedule into ``out_dir`` (resumable); returns how many were new."""
    if target.arch.vocab_size > np.iinfo(np.uint16).max + 1:
        raise ValueError("uint16 token storage needs a vocabulary of at most 65536 ids")
    out_dir.mkdir(parents=True, exist_ok=True)
    _check_spec(out_dir, spec)
    tally = _Tally(out_dir)
    eos = tuple(t for t in {tokenizer.eos_token_id} if t is not None)
    start, new_tokens, written = time.perf_counter(), 0, 0
    for index, family, number in shard_schedule(spec):
        path = out_dir / f"shard_{index:05d}.npz"
        if path.exists():
            continue
        out_of_time = time_budget_s is not None and time.perf_counter() - start > time_budget_s
        if tally.total >= spec.target_tokens or (written and out_of_time):  # a run makes at least one shard
            break
        encoded: dict[str, list[int]] = {}

        def unseen(text: str) -> bool:
            encoded[text] = encode_prompt(tokenizer, text, chat=True)
            return tuple(encoded[text]) not in tally.seen

        texts = _prompts(family, number, target, tokenizer, spec, sources, unseen)
        temperature = spec.temperatures[number % len(spec.temperatures)]
        requests = [
            Request(id=f"{index}.{i}", prompt=text, prompt_token_ids=encoded.get(text) or encode_prompt(
                        tokenizer, text, chat=True), max_new_tokens=spec.max_new_tokens, eos_token_ids=eos,
                    params=SamplingParams(temperature, 0, spec.top_p, seed=spec.seed * 1_000_003 + index * 1009 + i))
            for i, text in enumerate(texts)
        ]
        if requests:
            run_engine(target, requests, spec.batch_size)
        held_out = [family in spec.held_out_families or is_held_out(t, spec.row_held_out_share) for t in texts]
        save_shard(path, [r.prompt_token_ids for r in requests], [r.output_token_ids for r in requests], held_out,
                    families=[family] * len(requests), temperatures=[temperature] * len(requests))
        for request, flag in zip(requests, held_out):
            tally.seen.add(tuple(request.prompt_token_ids))
            tally.add(family, len(request.output_token_ids), flag)
        tally.shards += 1
        atomic_write_json(out_dir / "manifest.json", tally.manifest())
        tokens = sum(len(r.output_token_ids) for r in requests)
        new_tokens, written = new_tokens + tokens, written + 1
        elapsed = time.perf_counter() - start
        rate = new_tokens / max(elapsed, 1e-9)
        eta_h = max(0, spec.target_tokens - tally.total) / max(rate, 1e-9) / 3600
        log(f"{path.name} {family} T={temperature:g}: {len(requests)} prompts, {tokens} tokens | "
            f"corpus {tally.total}/{spec.target_tokens} tokens, {rate:.1f} tok/s, ETA {eta_h:.1f} h")
    atomic_write_json(out_dir / "manifest.json", tally.manifest())
    return written
