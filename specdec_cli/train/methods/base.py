"""The trainer registry: ``TRAINERS.get(method)`` is a trainable method's train schema, its rules and its task.

    TRAINERS.register("pard")(MethodTrainer(PardTrainConfig, build_pard_task, check_pard))

``specdec train`` composes every registered schema into its flat Hydra root (``config/train_root.py``),
checks the chosen one with its ``check`` and trains the ``Task`` its ``build_task`` returns.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from specdec_cli.config.schema import TrainConfig
from specdec_cli.config.train_root import EXCLUSIVE
from specdec_cli.drafters.learned import shipped_checkpoint
from specdec_cli.models import Transformer, eagle3_default_layers
from specdec_cli.registry import Registry
from specdec_cli.train.features import Sequences
from specdec_cli.train.tasks import Task


@dataclass(frozen=True)
class TaskInputs:
    """What a trainer builds its drafter from: the target, its tokenizer (None: toy), the corpus
    (training sequences first, ``num_train`` of them) and a resumed run's draft vocabulary (or None)."""

    target: Transformer
    tokenizer: Any
    sequences: Sequences
    num_train: int
    vocab_ids: Optional[torch.Tensor]


@dataclass(frozen=True)
class MethodTrainer:
    """One trainable method: its schema, its own rules (one message each) and its fresh drafter + objective."""

    schema: type[TrainConfig]
    build_task: Callable[[Any, TaskInputs], Task]  # (a ``schema`` instance, inputs) -> Task
    check: Callable[[Any], list[str]]  # a ``schema`` instance -> violated rules


TRAINERS: Registry[MethodTrainer] = Registry("trainer")


def at_least_one(cfg: TrainConfig, names: tuple[str, ...]) -> list[str]:
    """One message per field of ``names`` below 1."""
    return [f"{name}={getattr(cfg, name)} must be >= 1" for name in names if getattr(cfg, name) < 1]


def shared_layers(target: Transformer) -> tuple[int, ...]:
    """The target layers every feature cache stores (EAGLE-3's defaults; none for a target under 4 layers)."""
    return eagle3_default_layers(target.arch.num_layers) if target.arch.num_layers >= 4 else ()


def init_from_field() -> Any:
    """``init_from``, a field of the schemas that can warm-start: start from this checkpoint instead of random
    weights ("shipped": the project's own draft of this method; a resumed run ignores it). EXCLUSIVE: an error
    under a method that does not read it, which would silently start from scratch."""
    return field(default=None, metadata=EXCLUSIVE)


def check_init_from(cfg: TrainConfig) -> list[str]:
    """``init_from`` names "shipped" or a checkpoint directory."""
    init = getattr(cfg, "init_from", None)
    if init and init != "shipped" and not (Path(init).expanduser() / "config.json").is_file():
        return [f"init_from={init}: no config.json there (a checkpoint directory is expected)"]
    return []


def init_dir(cfg: TrainConfig) -> Optional[Path]:
    """``init_from`` as a path (None: start from random weights); "shipped": the project's own draft."""
    init = getattr(cfg, "init_from", None)
    if init == "shipped":
        return shipped_checkpoint(cfg.method.name, "checkpoint")
    return Path(init).expanduser() if init else None
