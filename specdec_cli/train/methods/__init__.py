"""Trainers: one file per trainable method (its train schema, rules and task), registered in ``TRAINERS``
(eagle3 and mtp share ``heads.py``; pard and dflash share ``block.py``'s fields).

Importing this package registers every trainable method of ``config/methods.py``'s table.
"""
from __future__ import annotations

from specdec_cli.config.methods import trainable_methods
from specdec_cli.config.schema import TrainConfig
from specdec_cli.train.methods import dflash, draft_target, heads, pard  # noqa: F401  (registration)
from specdec_cli.train.methods.base import TRAINERS, MethodTrainer, TaskInputs

__all__ = ["TRAINERS", "MethodTrainer", "TaskInputs", "train_schemas"]


def train_schemas() -> dict[str, type[TrainConfig]]:
    """method -> its train schema, for every trainable method of the table (in table order)."""
    return {name: TRAINERS.get(name).schema for name in trainable_methods()}
