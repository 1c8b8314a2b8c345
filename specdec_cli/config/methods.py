"""The one method table: every speculative method, written once, in the order ``specdec check`` lists them.

Config (schemas, store, validation), the support matrix, ``specdec check``, ``specdec train``, ``ship`` and
the tests read it; nothing else spells the method list. A method's drafter is registered under its name in
``drafters.DRAFTERS`` and, when ``trainable``, its trainer under its name in ``train.methods.TRAINERS``.
Adding a method: its schema in ``config/schema.py``, a row here, its column in ``config/matrix.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec_cli.config import schema as schemas
from specdec_cli.config.schema import MethodConfig

FAMILIES = ("none", "model", "retrieval")  # drafts nothing | a model draws q | retrieval (one-hot q)


@dataclass(frozen=True)
class MethodSpec:
    """One row: what ``method=<name>`` is made of."""

    name: str
    schema: type[MethodConfig]  # the ``method`` config group option's dataclass
    family: str  # one of FAMILIES
    trainable: bool = False  # ``specdec train method=<name>`` self-distils its drafter
    draft_model: bool = False  # its draft is a whole causal LM (may share the target's embedding / LM head)


TABLE: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        MethodSpec("none", schemas.NoneMethodConfig, "none"),
        MethodSpec("draft_target", schemas.DraftTargetMethodConfig, "model", trainable=True, draft_model=True),
        MethodSpec("mtp", schemas.MtpMethodConfig, "model", trainable=True),
        MethodSpec("eagle3", schemas.Eagle3MethodConfig, "model", trainable=True),
        MethodSpec("pard", schemas.PardMethodConfig, "model", trainable=True, draft_model=True),
        MethodSpec("dflash", schemas.DflashMethodConfig, "model", trainable=True),
        MethodSpec("ngram", schemas.NgramMethodConfig, "retrieval"),
        MethodSpec("suffix", schemas.SuffixMethodConfig, "retrieval"),
    )
}


def method_names(family: str | None = None) -> tuple[str, ...]:
    """Every method name in table order, or those of one ``family``."""
    return tuple(name for name, spec in TABLE.items() if family is None or spec.family == family)


def trainable_methods() -> tuple[str, ...]:
    """The methods ``specdec train`` trains, in table order."""
    return tuple(name for name, spec in TABLE.items() if spec.trainable)


def method_schemas() -> dict[str, type[MethodConfig]]:
    """name -> the ``method`` group option's dataclass."""
    return {name: spec.schema for name, spec in TABLE.items()}
