"""Statistics of ``specdec verify``: is the speculative output law the target's? (pure functions)

Each test compares the tokens at one position (or the joint of the first two positions)
of speculative samples with a reference:
- ``two_sample_test``: target-only samples. Chi-square test of homogeneity on the 2 × C
  contingency table (Pearson, no continuity correction); columns whose smaller expected count
  is below ``min_expected`` are pooled into one cell (and that cell into the smallest kept
  column if it is still sparse). Effect size: the total variation (TV) between the two
  empirical laws, on the unmerged categories.
- ``exact_test``: the exact target law (toy models): ``stats.fit`` (chi-square goodness of fit
  with sparse cells pooled, and TV against the law).
- ``conditional_test``: the target's own conditional law of each sampled token given its
  sampled prefix (one teacher-forced target forward per sample). Given the prefixes, the count
  of token c at position j is a sum of independent Bernoulli(P_i(c)), so its expectation is
  E_c = sum_i P_i(c); Pearson's statistic against E (sparse cells pooled, ``stats.fit``) is
  chi-square when all P_i are equal (position 1) and conservative otherwise (each cell's
  variance sum_i P_i(1 - P_i) is at most the multinomial one). It needs no enumeration of the
  vocabulary, so it works on real models; a token the target gives probability 0 fails.

Multiple testing (Bonferroni): with m tests in a verification and family-wise level alpha,
a test fails when ``p < alpha / m`` or when TV exceeds its bound. The TV bound is
``tv_factor * E[TV | same law] + 1 / n``: E[TV] under the null per category by the normal
approximation ``sqrt(2 p (1 - p) v / pi)`` (v = 1/n1 + 1/n2 for two samples, 1/n for one; p
the pooled or reference law), capped at the small-count limit ``2 p (1 - p)`` (a category
expected well under once per sample set contributes about 2p, not sqrt(p)), halved and
summed; ``tv_factor = z(alpha / 2m) / sqrt(2 / pi)``: for a two-category law
TV is half-normal, and a correct sampler exceeds the bound with probability alpha / m; with
more categories TV concentrates around its mean and the bound is conservative.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats as scipy_stats

from specdec_cli.verify.stats import fit

MIN_EXPECTED = 5.0
END = -1  # a sequence that stopped (EOS) before this position


@dataclass(frozen=True)
class Comparison:
    """One comparison of speculative samples with a reference."""

    prompt: str
    test: str  # "pos 2", "joint 1-2"
    reference: str  # "target" (target-only samples) | "exact" (the exact law, toy models)
    cells: int  # categories after pooling sparse ones
    chi2: float
    dof: int
    p_value: float
    tv: float
    tv_bound: float


@dataclass(frozen=True)
class Verdict:
    tests: tuple[Comparison, ...]
    alpha: float  # family-wise level
    threshold: float  # per-test p-value threshold: alpha / m (Bonferroni)
    tv_factor: float

    def failed(self, test: Comparison) -> bool:
        """Whether ``test`` rejects the target law (p below the threshold or TV above its bound)."""
        return test.p_value < self.threshold or test.tv > test.tv_bound

    @property
    def match(self) -> bool:
        """True when no test rejects "the speculative law is the target law"."""
        return not any(self.failed(test) for test in self.tests)


def bonferroni_tv_factor(alpha: float, num_tests: int) -> float:
    """``z(alpha / 2m) / sqrt(2 / pi)``: the TV bound's multiple of E[TV] (see the module doc)."""
    z = float(scipy_stats.norm.isf(alpha / (2 * max(num_tests, 1))))
    return z / math.sqrt(2 / math.pi)


def judge(tests: list[Comparison], alpha: float) -> Verdict:
    """The Bonferroni verdict over ``tests`` (their TV bounds must use the same ``num_tests``)."""
    threshold = alpha / max(len(tests), 1)
    return Verdict(tuple(tests), alpha, threshold, bonferroni_tv_factor(alpha, len(tests)))


def planned_tests(num_tokens: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, positions) of the tests per prompt and reference: each position, then the joint of 1-2."""
    tests = [(f"pos {t + 1}", (t,)) for t in range(num_tokens)]
    if num_tokens >= 2:
        tests.append(("joint 1-2", (0, 1)))
    return tests


def category_ids(samples: np.ndarray, positions: tuple[int, ...], vocab_size: int) -> np.ndarray:
    """samples [N, T] (``END`` after an early stop) -> one category id per row for ``positions``."""
    ids = np.zeros(samples.shape[0], dtype=np.int64)
    for position in positions:
        column = samples[:, position].astype(np.int64)
        ids = ids * (vocab_size + 1) + np.where(column == END, vocab_size, column)
    return ids


def expected_tv(law: np.ndarray, variance_scale: float) -> float:
    """E[TV] of a correct sampler: 0.5 * sum min(sqrt(2 p (1 - p) v / pi), 2 p (1 - p)),
    v = 1/n1 + 1/n2 (two samples) or 1/n (one sample against ``law``)."""
    p = np.clip(law, 0.0, 1.0)
    spread = p * (1 - p)
    return float(0.5 * np.minimum(np.sqrt(2 * spread * variance_scale / math.pi), 2 * spread).sum())


def two_sample_test(spec: np.ndarray, reference: np.ndarray, *, tv_factor: float,
                    min_expected: float = MIN_EXPECTED) -> tuple[int, float, int, float, float, float]:
    """Category ids of two samples -> (cells, chi2, dof, p_value, tv, tv_bound)."""
    categories, inverse = np.unique(np.concatenate([spec, reference]), return_inverse=True)
    n1, n2 = len(spec), len(reference)
    table = np.zeros((2, len(categories)), dtype=np.float64)
    np.add.at(table[0], inverse[:n1], 1.0)
    np.add.at(table[1], inverse[n1:], 1.0)
    tv = 0.5 * float(np.abs(table[0] / n1 - table[1] / n2).sum())
    bound = tv_factor * expected_tv(table.sum(0) / (n1 + n2), 1 / n1 + 1 / n2) + 1 / min(n1, n2)
    merged = merge_sparse_columns(table, min_expected)
    if merged.shape[1] < 2:
        return merged.shape[1], 0.0, 0, 1.0, tv, bound
    chi2, p_value, dof, _ = scipy_stats.chi2_contingency(merged, correction=False)
    return merged.shape[1], float(chi2), int(dof), float(p_value), tv, bound


def merge_sparse_columns(table: np.ndarray, min_expected: float) -> np.ndarray:
    """Pool the columns of a 2 × C count table whose smaller expected count is < ``min_expected``."""
    totals = table.sum(0)
    smaller_row_share = table.sum(1).min() / table.sum()
    sparse = totals * smaller_row_share < min_expected
    kept = table[:, ~sparse]
    pooled = table[:, sparse].sum(1, keepdims=True)
    if pooled.sum() == 0:
        return kept
    if pooled.sum() * smaller_row_share < min_expected and kept.shape[1] > 0:
        smallest = int(kept.sum(0).argmin())
        kept = kept.copy()
        kept[:, smallest] += pooled[:, 0]
        return kept
    return np.concatenate([kept, pooled], axis=1)


def exact_test(spec: np.ndarray, law: np.ndarray, *, tv_factor: float) -> tuple[int, float, int, float, float, float]:
    """Category ids [N] against the exact law over all ids [C] -> (cells, chi2, dof, p, tv, bound)."""
    return goodness_of_fit(np.bincount(spec, minlength=len(law)).astype(np.float64), law, tv_factor=tv_factor)


def goodness_of_fit(counts: np.ndarray, law: np.ndarray, *,
                    tv_factor: float) -> tuple[int, float, int, float, float, float]:
    """Counts [C] against a law [C] (``stats.fit``: sparse cells pooled; a count where the law
    is 0 gives p = 0) -> (cells, chi2, dof, p, tv, bound with the capped ``expected_tv``)."""
    law = law / law.sum()
    result = fit(torch.from_numpy(counts), torch.from_numpy(law), min_expected=MIN_EXPECTED)
    total = float(counts.sum())
    bound = tv_factor * expected_tv(law, 1 / total) + 1 / total
    return result.dof + 1, result.chi2, result.dof, result.p_value, result.total_variation, bound


def law_over_categories(law: np.ndarray, positions: tuple[int, ...]) -> np.ndarray:
    """The exact law [V] * T marginalised to ``positions``, over the ``category_ids`` space
    (each position gets an extra ``END`` category of probability 0), flattened."""
    other = tuple(d for d in range(law.ndim) if d not in positions)
    marginal = law.sum(axis=other) if other else law
    padded = np.pad(marginal, [(0, 1)] * marginal.ndim)
    return padded.reshape(-1)


def conditional_test(tokens: np.ndarray, expected: np.ndarray, *,
                     tv_factor: float) -> tuple[int, float, int, float, float, float]:
    """Tokens [n] at one position (no ``END``) against the expected counts [V] given their
    prefixes (``sum_i P_i``) -> (cells, chi2, dof, p, tv, bound); no tokens: no evidence."""
    if len(tokens) == 0:
        return 0, 0.0, 0, 1.0, 0.0, 0.0
    counts = np.bincount(tokens, minlength=len(expected)).astype(np.float64)
    return goodness_of_fit(counts, expected, tv_factor=tv_factor)
