"""``specdec train``'s Hydra root: one flat config over every method's train schema, and back.

Each trainable method has its own train schema (a ``TrainConfig`` subclass next to its trainer). The command
line stays flat (``specdec train method=pard pard_layers=4``), so Hydra composes ``train_root_schema``:
``TrainConfig`` plus every method's own fields, each once. ``narrow`` turns the composed object into the
chosen method's schema. Fields of other methods are ignored (one command line may serve several methods),
except those marked ``EXCLUSIVE`` (e.g. ``init_from``: a checkpoint to start from must not be dropped
silently): set away from their default under a method that does not read them, they are errors.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any

from specdec_cli.config.schema import TrainConfig

#: field metadata of a train field that is an error, not ignored, under a method that does not read it
EXCLUSIVE = {"exclusive": True}


def _own_fields(schema: type[TrainConfig]) -> list[dataclasses.Field]:
    common = {f.name for f in dataclasses.fields(TrainConfig)}
    return [f for f in dataclasses.fields(schema) if f.name not in common]


def train_root_schema(schemas: dict[str, type[TrainConfig]]) -> type[TrainConfig]:
    """``TrainConfig`` plus the own fields of every method's schema (``schemas``: method -> schema), named
    ``TrainConfig`` as messages about the root name it. A field several schemas share (``mask_token_id``)
    must be the same field in each (inherited from one base)."""
    fields: dict[str, tuple[str, Any, dataclasses.Field]] = {}
    for schema in schemas.values():
        hints = typing.get_type_hints(schema)
        for f in _own_fields(schema):
            seen = fields.setdefault(f.name, (f.name, hints[f.name], dataclasses.field(default=f.default)))
            if seen[2].default != f.default:
                raise ValueError(f"train schemas disagree on the default of {f.name}")
    return dataclasses.make_dataclass("TrainConfig", list(fields.values()), bases=(TrainConfig,))


def narrow(flat: TrainConfig, schemas: dict[str, type[TrainConfig]]) -> tuple[TrainConfig, list[str]]:
    """(the chosen method's schema filled from ``flat``, one problem per ``EXCLUSIVE`` field set that it
    does not read). A method without a schema (not trainable) gets ``flat`` back and no problems (its check
    says why)."""
    schema = schemas.get(flat.method.name)
    if schema is None:
        return flat, []
    mine = {f.name for f in dataclasses.fields(schema)}
    readers: dict[str, list[str]] = {}
    for name, other in schemas.items():
        for f in _own_fields(other):
            if f.metadata.get("exclusive") and f.name not in mine and getattr(flat, f.name) != f.default:
                readers.setdefault(f.name, []).append(name)
    problems = [f"{field} is read by {', '.join(names)} only, not method={flat.method.name}"
                for field, names in readers.items()]
    return schema(**{name: getattr(flat, name) for name in mine}), problems
