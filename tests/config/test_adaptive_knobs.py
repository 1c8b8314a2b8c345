"""The confidence stop, the suffix enhancer and adaptive skipping as config knobs: matrix rows, value checks
(one clear line each) and the method families that may use them."""
from __future__ import annotations

import pytest

from specdec_cli.config.compose import compose_config
from specdec_cli.config.hardware import Hardware
from specdec_cli.config.matrix import METHODS, MODEL_BASED, RETRIEVAL, support
from specdec_cli.config.validate import resolve
from specdec_cli.errors import ConfigError

CPU = Hardware(cuda=False, flashinfer_problem="flashinfer needs a CUDA device")


def violations(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        resolve(compose_config(list(overrides)), CPU)
    return info.value.violations


def test_matrix_rows() -> None:
    for feature in ("confidence_stop", "suffix_enhancer"):
        assert {m for m in METHODS if support(m, feature).supported} == set(MODEL_BASED), feature
    assert {m for m in METHODS if support(m, "adaptive_skip").supported} == set(MODEL_BASED + RETRIEVAL)
    assert "one-hot q" in support("eagle3", "suffix_enhancer").reason
    assert "exact" in support("eagle3", "suffix_enhancer").reason
    assert "retrieval" in support("suffix", "suffix_enhancer").reason


@pytest.mark.parametrize("overrides, expected", [
    (("method=eagle3", "method.draft_confidence=1.0"), "method.draft_confidence=1.0 must be in [0, 1) (0 = off)"),
    (("method=eagle3", "method.draft_confidence=-0.1"), "method.draft_confidence=-0.1 must be in [0, 1) (0 = off)"),
    (("method=eagle3", "method.suffix_enhancer=true", "method.suffix_min_match=0"),
     "method.suffix_min_match=0 must be >= 1"),
    (("method=pard", "method.adaptive_min_accept=-1"), "method.adaptive_min_accept=-1.0 must be >= 0 (0 = off)"),
    (("method=pard", "method.adaptive_min_accept=0.5", "method.adaptive_probe_every=0"),
     "method.adaptive_probe_every=0 must be >= 1"),
])
def test_bad_values_are_one_line_each(overrides: tuple[str, ...], expected: str) -> None:
    assert violations(*overrides) == [expected]


@pytest.mark.parametrize("method", ["suffix", "ngram", "none"])
def test_enhancer_and_confidence_need_a_model_drafter(method: str) -> None:
    enhancer = violations(f"method={method}", "method.suffix_enhancer=true")
    assert len(enhancer) == 1 and enhancer[0].startswith(f"method={method} does not support the suffix enhancer")
    confidence = violations(f"method={method}", "method.draft_confidence=0.5")
    assert len(confidence) == 1 and confidence[0].startswith(f"method={method} does not support the confidence stop")


def test_enhancer_with_explicit_rejection_is_allowed() -> None:
    """Its retrieval drafts carry the one-hot q they were drawn from: rejection sampling stays exact."""
    effective = resolve(compose_config(["method=eagle3", "method.suffix_enhancer=true", "method.draft_confidence=0.3",
                                        "method.adaptive_min_accept=0.5", "rejection=on", "sampler=temperature"]), CPU)
    assert effective.rejection
