"""DFlash: ``dflash_layers`` layers at the target's width drafting blocks of ``method.num_draft_tokens + 1``
tokens from the target's features at ``method.target_layers``."""
from __future__ import annotations

from dataclasses import dataclass

from specdec_cli.drafters.dflash import load_dflash
from specdec_cli.errors import ConfigError
from specdec_cli.train.block_tasks import DflashTask
from specdec_cli.train.dflash_objective import init_dflash
from specdec_cli.train.methods.base import TRAINERS, MethodTrainer, TaskInputs, at_least_one, shared_layers
from specdec_cli.train.methods.base import init_dir
from specdec_cli.train.methods.block import BlockTrainConfig, check_block, mask_token
from specdec_cli.train.tasks import Task


@dataclass
class DflashTrainConfig(BlockTrainConfig):
    """``specdec train method=dflash``: reads ``method.target_layers`` (None: the shared feature layers,
    EAGLE-3's defaults, so one feature cache serves every method). ``init_from``: a DFlash directory."""

    dflash_layers: int = 2  # draft layers (random init, the target's width, embedding and LM head)
    dflash_anchors: int = 16  # blocks (random response anchors) per sequence and step


def check_dflash(cfg: DflashTrainConfig) -> list[str]:
    return at_least_one(cfg, ("dflash_layers", "dflash_anchors")) + check_block(cfg)


def build_dflash_task(cfg: DflashTrainConfig, inputs: TaskInputs) -> Task:
    """A fresh draft reading ``method.target_layers``, or ``init_from``'s with the block size of this run."""
    target, k, init = inputs.target, cfg.method.num_draft_tokens, init_dir(cfg)
    target_layers = getattr(cfg.method, "target_layers", None)
    if init is not None:
        draft = load_dflash(init, target, target_layers=target_layers)
        draft.block_size = k + 1
        if cfg.mask_token_id is not None:
            draft.mask_token_id = mask_token(cfg, target, inputs.tokenizer)
        return DflashTask(draft.requires_grad_(True).train(), target, num_anchors=cfg.dflash_anchors, seed=cfg.seed)
    num = target.arch.num_layers
    layers = tuple(target_layers or shared_layers(target) or range(num))
    if not all(0 <= layer < num for layer in layers):
        raise ConfigError([f"method.target_layers={list(layers)} must be output-of-layer ids in 0..{num - 1}"])
    draft = init_dflash(target, layers, mask_token_id=mask_token(cfg, target, inputs.tokenizer),
                        num_layers=cfg.dflash_layers, block_size=k + 1, seed=cfg.seed)
    return DflashTask(draft, target, num_anchors=cfg.dflash_anchors, seed=cfg.seed)


TRAINERS.register("dflash")(MethodTrainer(DflashTrainConfig, build_dflash_task, check_dflash))
