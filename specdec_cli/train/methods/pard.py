"""PARD: a small causal LM that drafts ``method.num_draft_tokens`` tokens per forward from mask tokens."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from specdec_cli.drafters.pard import MASK_KEYS
from specdec_cli.errors import ConfigError
from specdec_cli.models import Transformer
from specdec_cli.models.loading import ModelLoadError, load_hf_dir
from specdec_cli.train.block_tasks import PardTask
from specdec_cli.train.methods.base import TRAINERS, MethodTrainer, TaskInputs, at_least_one
from specdec_cli.train.methods.base import init_dir
from specdec_cli.train.methods.block import BlockTrainConfig, check_block, mask_token
from specdec_cli.train.pard_objective import init_pard_from_target
from specdec_cli.train.tasks import Task


@dataclass
class PardTrainConfig(BlockTrainConfig):
    """``specdec train method=pard``: a ``pard_layers`` x ``pard_hidden_size`` causal LM (embedding from the
    target's). ``init_from``: a causal-LM directory with the target's tokenizer (PARD adapts an existing
    small LM; e.g. the shipped draft_target draft, whose embedding stays the target's, frozen)."""

    pard_layers: int = 4  # draft layers (random init)
    pard_hidden_size: int = 128  # draft width, a multiple of the target's head dim, <= its hidden size
    pard_keep_ratio: float = 0.7  # conditional drop-token r, mask depth g keeps max(r^g, 0.2) (1: no drop)


def check_pard(cfg: PardTrainConfig) -> list[str]:
    out = at_least_one(cfg, ("pard_layers", "pard_hidden_size"))
    if not 0 < cfg.pard_keep_ratio <= 1:
        out.append(f"pard_keep_ratio={cfg.pard_keep_ratio} must be in (0, 1]")
    return out + check_block(cfg)


def build_pard_task(cfg: PardTrainConfig, inputs: TaskInputs) -> Task:
    """A fresh draft, or ``init_from``'s (its own mask token unless ``mask_token_id`` is set)."""
    target, init = inputs.target, init_dir(cfg)
    if init is not None:
        model, init_mask = pard_start(init, target)
    else:
        try:
            model = init_pard_from_target(target, cfg.pard_layers, hidden_size=cfg.pard_hidden_size, seed=cfg.seed)
        except ValueError as err:
            raise ConfigError([f"pard_hidden_size={cfg.pard_hidden_size}: {err}"]) from None
        init_mask = None
    mask = init_mask if init_mask is not None and cfg.mask_token_id is None else mask_token(cfg, target, inputs.tokenizer)
    return PardTask(model, target, mask_token_id=mask, depth=cfg.method.num_draft_tokens,
                    keep_ratio=cfg.pard_keep_ratio, tokenizer=inputs.tokenizer, seed=cfg.seed)


def pard_start(directory: Path, target: Transformer) -> tuple[Transformer, Optional[int]]:
    """(trainable float32 model, its mask token id if it is a PARD checkpoint) from ``init_from``: a causal
    LM with the target's vocabulary. Tensors equal to the target's (a shared embedding / LM head) stay frozen."""
    problem = f"init_from={directory}"
    try:
        model = load_hf_dir(directory, dtype=torch.float32, device=target.device, shared_from=target)
    except ModelLoadError as err:
        raise ConfigError([f"{problem}: {err}"]) from None
    if model.arch.vocab_size != target.arch.vocab_size:
        raise ConfigError([f"{problem}: vocabulary {model.arch.vocab_size} != the target's {target.arch.vocab_size} "
                           "(PARD needs the target's tokenizer)"])
    model.requires_grad_(True).train()
    for mine, theirs in ((model.embed_tokens.weight, target.embed_tokens.weight),
                         (model.lm_head.weight, target.lm_head.weight)):
        if mine.shape == theirs.shape and torch.equal(mine, theirs.to(mine.dtype)):
            mine.requires_grad_(False)
    config = json.loads((directory / "config.json").read_text())
    found = [config[key] for key in MASK_KEYS if isinstance(config.get(key), int)]
    return model, (found[0] if found else None)


TRAINERS.register("pard")(MethodTrainer(PardTrainConfig, build_pard_task, check_pard))
