"""The support matrix says what DESIGN.md says, for every method × feature."""
from __future__ import annotations

import pytest

from specdec_cli.config.matrix import (
    FEATURES,
    MATRIX,
    METHODS,
    MODEL_BASED,
    PLANNED,
    REJECTION_EXCLUSIONS,
    RETRIEVAL,
    support,
)

SPECULATIVE = MODEL_BASED + RETRIEVAL


def supported_by(feature: str) -> set[str]:
    return {method for method in METHODS if support(method, feature).supported}


def test_every_cell_exists_and_every_refusal_has_a_reason() -> None:
    assert set(MATRIX) == set(FEATURES)
    for feature, row in MATRIX.items():
        assert list(row) == list(METHODS), feature
        for method, cell in row.items():
            assert cell.supported or cell.reason, (method, feature)


def test_rows() -> None:
    assert supported_by("rejection_sampling") == set(MODEL_BASED)
    assert supported_by("relaxed_acceptance") == {"mtp"}
    assert "lossy" in support("mtp", "relaxed_acceptance").reason
    assert supported_by("draft_vocab_mapping") == {"eagle3"}
    assert supported_by("dynamic_draft_length") == set(SPECULATIVE)
    assert supported_by("flashinfer_backend") == set(MODEL_BASED)
    for feature in ("tensor_parallel", "attention_dp"):
        assert supported_by(feature) == set(METHODS), feature
    for feature in ("context_parallel", "guided_decoding"):
        assert supported_by(feature) == set(), feature


@pytest.mark.parametrize("method", SPECULATIVE)
def test_reasons(method: str) -> None:
    assert "rank" in support(method, "tensor_parallel").reason
    assert "rank" in support(method, "attention_dp").reason
    assert "whole-vocabulary target rows" in support(method, "context_parallel").reason
    if method in RETRIEVAL:
        assert "one-hot q" in support(method, "rejection_sampling").reason


def test_rejection_exclusions_name_features() -> None:
    assert set(REJECTION_EXCLUSIONS) == {"relaxed_acceptance", "guided_decoding", "context_parallel"}
    assert "target distribution" in REJECTION_EXCLUSIONS["guided_decoding"]
