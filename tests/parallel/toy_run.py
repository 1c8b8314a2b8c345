"""Toy checkpoints on disk and run configs for the parallel tests (spawned ranks load from disk).

The toy target has 6 query / 3 KV heads and a 35-token vocabulary, so two ranks get uneven
shards (2 + 1 KV heads, 18 + 17 vocabulary rows), as the embedded SmolLM2 does (3 KV heads).
Its tokenizer is a word-level one over ``w0 .. w34`` so prompts map to known ids.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specdec_cli.config.compose import compose_config
from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.hardware import Hardware
from specdec_cli.config.schema import RunConfig
from specdec_cli.config.validate import resolve
from specdec_cli.drafters.dflash import save_dflash
from specdec_cli.drafters.eagle3 import save_eagle3
from specdec_cli.drafters.mtp import save_mtp
from specdec_cli.drafters.pard import save_pard
from specdec_cli.testing import toy_model
from specdec_cli.train.dflash_objective import init_dflash
from specdec_cli.train.heads import new_draft_model, new_eagle3, new_mtp, save_draft_model

Paths = dict[str, Path]  # checkpoint name -> directory (and "prompts" -> the prompts file)
Methods = dict[str, list[str]]  # run name -> method overrides
Reference = Callable[..., list[dict]]  # overrides -> single-process outputs.jsonl rows

VOCAB = 35
ARCH = dict(vocab_size=VOCAB, num_layers=3, hidden_size=48, num_heads=6, num_kv_heads=3)
CPU = Hardware(cuda=False, flashinfer_problem="no CUDA in tests")
PROMPTS = (
    "w1 w2 w3 w4 w1 w2 w3 w4 w1 w2",
    "w7 w7 w8 w9 w10",
    "w3 w1 w4 w1 w5 w9 w2 w6 w5 w3 w5",
    "w20 w21 w22 w20 w21 w22 w20",
    "w11",
)


def _tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0")


def write_toy_tree(root: Path) -> dict[str, Path]:
    """The target, a separate draft model, EAGLE-3 / MTP / PARD / DFlash checkpoints and prompts under ``root``."""
    tokenizer = _tokenizer()
    target = toy_model(0, sharpness=2.0, **ARCH)
    paths = {name: root / name for name in ("target", "draft", "eagle3", "mtp", "pard", "dflash")}
    save_draft_model(target, paths["target"], tokenizer)
    save_draft_model(new_draft_model(target, 1), paths["draft"], tokenizer)
    used = torch.tensor([i for i in range(VOCAB) if i % 4 != 3])  # a reduced draft vocabulary (d2t)
    save_eagle3(new_eagle3(target, used, hidden_layers=(0, 1, 2), seed=1), paths["eagle3"])
    save_mtp(new_mtp(target, used, seed=1), paths["mtp"], target_num_layers=ARCH["num_layers"])
    save_pard(toy_model(3, sharpness=2.0, **{**ARCH, "num_layers": 1}), paths["pard"], mask_token_id=VOCAB - 1)
    save_dflash(init_dflash(target, (0, 2), mask_token_id=VOCAB - 1, num_layers=1, block_size=3, seed=1),
                paths["dflash"])
    paths["prompts"] = root / "prompts.jsonl"
    paths["prompts"].write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return paths


def method_overrides(paths: dict[str, Path]) -> dict[str, list[str]]:
    """Run name -> the method overrides of every configuration the tests compare."""
    return {
        "none": ["method=none"],
        "ngram": ["method=ngram", "method.num_draft_tokens=3"],
        "suffix": ["method=suffix", "method.num_draft_tokens=3"],
        "self_spec": ["method=draft_target", "method.self_speculative_layers=1", "method.num_draft_tokens=3"],
        "draft_model": ["method=draft_target", f"method.draft_path={paths['draft']}", "method.num_draft_tokens=3"],
        "eagle3": ["method=eagle3", f"method.checkpoint={paths['eagle3']}", "method.num_draft_tokens=3"],
        "mtp": ["method=mtp", f"method.checkpoint={paths['mtp']}", "method.num_draft_tokens=2"],
        "pard": ["method=pard", f"method.checkpoint={paths['pard']}", "method.num_draft_tokens=3"],
        "dflash": ["method=dflash", f"method.checkpoint={paths['dflash']}", "method.num_draft_tokens=2"],
    }


def run_config(paths: dict[str, Path], *overrides: str) -> tuple[RunConfig, EffectiveConfig]:
    """A validated config for the toy target over the toy prompts (greedy unless overridden)."""
    cfg = compose_config([
        "model=hf", f"model.path={paths['target']}", "model.chat_template=false", "workload=jsonl",
        f"workload.path={paths['prompts']}", "workload.max_new_tokens=10", "engine.max_batch_size=2",
        "engine.max_seq_len=64", "engine.prefill_chunk=4", *overrides,
    ])
    return cfg, resolve(cfg, CPU)


def outputs(output_dir: Path) -> list[dict]:
    """The rows of ``outputs.jsonl`` in ``output_dir``."""
    return [json.loads(line) for line in (output_dir / "outputs.jsonl").read_text().splitlines()]


def results(output_dir: Path) -> dict:
    return json.loads((output_dir / "results.json").read_text())
