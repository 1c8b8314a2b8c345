"""EAGLE-3 and MTP heads: a chain of ``ttt_steps`` unrolled steps over a reduced draft vocabulary (d2t)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from specdec_cli.config.schema import TrainConfig
from specdec_cli.drafters.eagle3 import MAX_LAYERS, load_eagle3
from specdec_cli.drafters.feature_head import FeatureHead
from specdec_cli.drafters.mtp import load_mtp
from specdec_cli.errors import ConfigError
from specdec_cli.sampling.vocab import draft_to_target_ids
from specdec_cli.train.heads import deepen_eagle3, draft_vocabulary, new_eagle3, new_mtp, revocab_eagle3
from specdec_cli.train.methods.base import (
    TRAINERS, MethodTrainer, TaskInputs, at_least_one, check_init_from, init_dir, init_from_field,
)
from specdec_cli.train.tasks import HeadTask, Task


@dataclass
class HeadTrainConfig(TrainConfig):
    """``specdec train method=eagle3 | mtp`` (eagle3 fuses the target layers of ``method.target_layers``)."""

    ttt_steps: int = 3  # chain steps unrolled per example (training-time test; 1: none)
    step_weight: float = 0.8  # loss weight of unrolled step j is step_weight ** j
    # plus tv_weight * the total variation between head and target (1 - TV: a T=1 draft's acceptance chance)
    tv_weight: float = 0.0
    draft_vocab_size: int = 8192  # most frequent response tokens (d2t); <= 0: the target's vocabulary
    # eagle3 with init_from: rebuild the draft vocabulary from this corpus at draft_vocab_size (trained rows kept,
    # new ids start at the target's rows); false: keep the checkpoint's vocabulary
    revocab: bool = False
    # eagle3: layers of the head (0: the warm start's, else 1); a warm start gets identity-initialised plain
    # layers appended, so training starts from what the checkpoint drafts
    head_layers: int = 0
    # warm start: a head of this method (its weights and draft vocabulary; "shipped": the project's own)
    init_from: Optional[str] = init_from_field()


def check_head(cfg: HeadTrainConfig) -> list[str]:
    out = at_least_one(cfg, ("ttt_steps",))
    if cfg.revocab and (cfg.method.name != "eagle3" or not cfg.init_from):
        out.append("revocab=true rebuilds a warm-started EAGLE-3 head's vocabulary: "
                   "it needs method=eagle3 and init_from")
    if cfg.head_layers and (cfg.method.name != "eagle3" or not 1 <= cfg.head_layers <= MAX_LAYERS):
        out.append(f"head_layers={cfg.head_layers} sets an EAGLE-3 head's depth: it needs method=eagle3 and "
                   f"1..{MAX_LAYERS}")
    if not cfg.step_weight > 0:
        out.append(f"step_weight={cfg.step_weight} must be > 0")
    if not cfg.tv_weight >= 0:
        out.append(f"tv_weight={cfg.tv_weight} must be >= 0")
    return out + check_init_from(cfg)


def draft_vocab_ids(cfg: HeadTrainConfig, inputs: TaskInputs) -> torch.Tensor | None:
    """A resumed run's vocabulary, else the ``draft_vocab_size`` most frequent ids of the training sequences
    (None: the target's whole vocabulary)."""
    vocab = inputs.target.arch.vocab_size
    if inputs.vocab_ids is not None or not 0 < cfg.draft_vocab_size < vocab:
        return inputs.vocab_ids
    responses, prompts = torch.zeros(vocab, dtype=torch.int64), torch.zeros(vocab, dtype=torch.int64)
    sequences = inputs.sequences
    for tokens, prompt_len in zip(sequences.tokens[: inputs.num_train], sequences.prompt_lens[: inputs.num_train]):
        prompts += torch.bincount(tokens[:prompt_len], minlength=vocab)
        responses += torch.bincount(tokens[prompt_len:], minlength=vocab)
    return draft_vocabulary(responses, prompts, cfg.draft_vocab_size)


def head_task(head: FeatureHead, cfg: HeadTrainConfig, inputs: TaskInputs) -> HeadTask:
    return HeadTask(head, inputs.target, steps=cfg.ttt_steps, step_weight=cfg.step_weight, tv_weight=cfg.tv_weight)


def build_eagle3_task(cfg: HeadTrainConfig, inputs: TaskInputs) -> Task:
    init, target = init_dir(cfg), inputs.target
    if init is not None:
        head = load_eagle3(init, target, target_layers=getattr(cfg.method, "target_layers", None),
                           device=target.device)
        ids = draft_vocab_ids(cfg, inputs) if cfg.revocab or inputs.vocab_ids is not None else None
        current = draft_to_target_ids(torch.arange(head.draft_vocab_size, device=head.d2t.device), head.d2t)
        if ids is not None and not torch.equal(ids.cpu(), current.cpu()):
            head = revocab_eagle3(head, target, ids)
        if cfg.head_layers > head.num_layers:
            head = deepen_eagle3(head, cfg.head_layers, seed=cfg.seed)
        elif cfg.head_layers and cfg.head_layers < head.num_layers:
            raise ConfigError([f"head_layers={cfg.head_layers}: {init} holds a {head.num_layers}-layer head "
                               "(a head can be deepened, not cut)"])
        return head_task(head.train(), cfg, inputs)
    ids = draft_vocab_ids(cfg, inputs)
    ids = ids if ids is not None else torch.arange(inputs.target.arch.vocab_size)
    head = new_eagle3(inputs.target, ids, hidden_layers=getattr(cfg.method, "target_layers", None), seed=cfg.seed,
                      num_layers=max(1, cfg.head_layers))
    return head_task(head, cfg, inputs)


def build_mtp_task(cfg: HeadTrainConfig, inputs: TaskInputs) -> Task:
    init = init_dir(cfg)
    if init is not None:
        head = load_mtp(init, inputs.target, device=inputs.target.device).train()
    else:
        head = new_mtp(inputs.target, draft_vocab_ids(cfg, inputs), seed=cfg.seed)
    return head_task(head, cfg, inputs)


TRAINERS.register("eagle3")(MethodTrainer(HeadTrainConfig, build_eagle3_task, check_head))
TRAINERS.register("mtp")(MethodTrainer(HeadTrainConfig, build_mtp_task, check_head))
