"""The statistics of ``specdec verify`` (pure): two-sample and exact tests, Bonferroni, calibration."""
from __future__ import annotations

import math

import numpy as np
import pytest

from specdec_cli.verify import lossless
from specdec_cli.verify.lossless import END, Comparison


def test_identical_samples_match_and_disjoint_ones_differ() -> None:
    a = np.repeat(np.arange(4), 50)
    cells, chi2, dof, p, tv, bound = lossless.two_sample_test(a, a.copy(), tv_factor=3.0)
    assert (cells, chi2, dof, p, tv) == (4, 0.0, 3, pytest.approx(1.0), 0.0) and bound > 0
    cells, chi2, dof, p, tv, bound = lossless.two_sample_test(a, a + 4, tv_factor=3.0)
    assert p < 1e-30 and tv == pytest.approx(1.0) and tv > bound


def test_a_single_category_is_no_evidence() -> None:
    same = np.zeros(30, dtype=np.int64)
    assert lossless.two_sample_test(same, same, tv_factor=3.0)[:4] == (1, 0.0, 0, 1.0)


def test_sparse_columns_are_pooled() -> None:
    table = np.array([[50, 40, 3, 2, 0], [50, 40, 2, 2, 1]], dtype=float)
    merged = lossless.merge_sparse_columns(table, 5.0)
    assert merged.tolist() == [[50, 40, 5], [50, 40, 5]]
    tiny = np.array([[50, 40, 1], [50, 40, 0]], dtype=float)  # the pooled cell is still sparse
    assert lossless.merge_sparse_columns(tiny, 5.0).tolist() == [[50, 41], [50, 40]]


def test_bonferroni_tv_factor() -> None:
    assert lossless.bonferroni_tv_factor(0.01, 1) == pytest.approx(2.5758 / math.sqrt(2 / math.pi), rel=1e-4)
    assert lossless.bonferroni_tv_factor(0.01, 16) > lossless.bonferroni_tv_factor(0.01, 4)
    tests = [Comparison("p", "pos 1", "target-only", 2, 0.0, 1, 0.002, 0.0, 1.0)] * 8
    verdict = lossless.judge(tests, alpha=0.01)
    assert verdict.threshold == pytest.approx(0.00125) and verdict.match
    assert not lossless.judge(tests[:4], alpha=0.01).match  # 4 tests: p < 0.0025 fails


def test_verdict_fails_on_p_value_or_tv() -> None:
    ok = Comparison("p", "pos 1", "target-only", 2, 0.0, 1, 0.5, 0.01, 0.05)
    low_p = Comparison("p", "pos 2", "target-only", 2, 30.0, 1, 1e-9, 0.01, 0.05)
    big_tv = Comparison("p", "pos 3", "target-only", 2, 0.0, 1, 0.5, 0.2, 0.05)
    assert lossless.judge([ok, ok], 0.01).match
    assert not lossless.judge([ok, low_p], 0.01).match and not lossless.judge([ok, big_tv], 0.01).match


@pytest.mark.parametrize("law", [[0.5, 0.5], [0.9, 0.1], [0.4, 0.3, 0.2, 0.1] + [0.0] * 4])
def test_a_correct_sampler_rarely_fails(law: list[float]) -> None:
    """Calibration: same-law samples fail at most at about the nominal per-test level."""
    rng = np.random.default_rng(0)
    probs = np.array(law)
    factor = lossless.bonferroni_tv_factor(0.05, 1)
    failures = 0
    for _ in range(400):
        a, b = rng.choice(len(probs), 300, p=probs), rng.choice(len(probs), 300, p=probs)
        _, _, _, p, tv, bound = lossless.two_sample_test(a, b, tv_factor=factor)
        failures += p < 0.05 or tv > bound
    assert failures / 400 < 0.1


def test_category_ids_and_the_end_category() -> None:
    samples = np.array([[1, 2, 0], [3, END, END]])
    assert lossless.category_ids(samples, (1,), 4).tolist() == [2, 4]
    assert lossless.category_ids(samples, (0, 1), 4).tolist() == [1 * 5 + 2, 3 * 5 + 4]


def test_exact_law_over_categories_and_exact_test() -> None:
    law = np.full((3, 3, 3), 1 / 27)
    joint = lossless.law_over_categories(law, (0, 1))
    assert joint.shape == (16,) and joint.sum() == pytest.approx(1.0) and joint.reshape(4, 4)[3].sum() == 0
    rng = np.random.default_rng(1)
    samples = rng.integers(0, 3, size=(900, 3))
    ids = lossless.category_ids(samples, (0, 1), 3)
    cells, chi2, dof, p, tv, bound = lossless.exact_test(ids, joint, tv_factor=3.0)
    assert p > 1e-3 and tv <= bound and cells == 9  # 9 possible pairs, none sparse
    biased = np.where(rng.random(samples.shape) < 0.3, 0, samples)
    assert lossless.exact_test(lossless.category_ids(biased, (0, 1), 3), joint, tv_factor=3.0)[3] < 1e-6


def test_planned_tests() -> None:
    assert lossless.planned_tests(1) == [("pos 1", (0,))]
    assert [name for name, _ in lossless.planned_tests(3)] == ["pos 1", "pos 2", "pos 3", "joint 1-2"]


def test_conditional_test_uses_the_summed_conditional_laws() -> None:
    rng = np.random.default_rng(2)
    laws = -np.sort(-rng.dirichlet(np.ones(6), size=800), axis=1)  # a different law per sample, peaked at 0
    tokens = np.array([rng.choice(6, p=law) for law in laws])
    cells, chi2, dof, p, tv, bound = lossless.conditional_test(tokens, laws.sum(0), tv_factor=3.0)
    assert p > 1e-3 and tv <= bound and cells == 6
    shuffled = np.array([rng.choice(6, p=np.roll(law, 1)) for law in laws[:400]] + list(tokens[400:]))
    assert lossless.conditional_test(shuffled, laws.sum(0), tv_factor=3.0)[3] < 1e-6
    impossible = lossless.conditional_test(np.array([0, 1, 2]), np.array([1.5, 1.5, 0.0]), tv_factor=3.0)
    assert impossible[3] == 0.0
    assert lossless.conditional_test(np.array([], dtype=np.int64), np.zeros(3), tv_factor=3.0)[3] == 1.0
