"""A draft model: the target's first ``draft_layers`` layers, distilled as a causal LM."""
from __future__ import annotations

from dataclasses import dataclass

from specdec_cli.config.schema import TrainConfig
from specdec_cli.errors import ConfigError
from specdec_cli.train.heads import new_draft_model
from specdec_cli.train.methods.base import TRAINERS, MethodTrainer, TaskInputs, at_least_one
from specdec_cli.train.tasks import DraftModelTask, Task


@dataclass
class DraftTargetTrainConfig(TrainConfig):
    """``specdec train method=draft_target``."""

    draft_layers: int = 2  # layers, initialised from the target's first layers


def check_draft_target(cfg: DraftTargetTrainConfig) -> list[str]:
    return at_least_one(cfg, ("draft_layers",))


def build_draft_target_task(cfg: DraftTargetTrainConfig, inputs: TaskInputs) -> Task:
    target = inputs.target
    if not 1 <= cfg.draft_layers <= target.arch.num_layers:
        raise ConfigError([f"draft_layers={cfg.draft_layers} must be in 1..{target.arch.num_layers}"])
    return DraftModelTask(new_draft_model(target, cfg.draft_layers), target, inputs.tokenizer)


TRAINERS.register("draft_target")(MethodTrainer(DraftTargetTrainConfig, build_draft_target_task, check_draft_target))
