"""Goodness-of-fit helpers for the sampling tests: chi-square AND a total-variation bound sized to n.

TV bound for n i.i.d. draws from ``law``: each ``|count_i / n - p_i|`` is about half-normal with scale
``s_i = sqrt(p_i (1 - p_i) / n)``, so ``E[TV] = 1/2 sum_i s_i sqrt(2 / pi)`` and
``sd[TV] ~= 1/2 sqrt((1 - 2 / pi) sum_i s_i^2)``. A correct sampler stays under ``E + 4 sd``
(16 equal categories, 10^6 draws: 0.0016 + 4 * 0.0003 = 0.0027, i.e. about sqrt(V / n) / 1.5).
Sampler bugs that matter (wrong residual, wrong bonus row, off-by-one ids) move TV by 0.01 or more.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

CHI_SQUARE_ALPHA = 1e-4


def tv_bound(law: np.ndarray, n: int, sigmas: float = 4.0) -> float:
    """Upper bound on TV(empirical law of n draws, law) that a correct sampler respects."""
    scale_sq = law * (1 - law) / n
    mean = 0.5 * math.sqrt(2 / math.pi) * float(np.sqrt(scale_sq).sum())
    sd = 0.5 * math.sqrt((1 - 2 / math.pi) * float(scale_sq.sum()))
    return mean + sigmas * sd


def assert_law(samples: torch.Tensor, law: torch.Tensor | np.ndarray) -> None:
    """samples [n] ids in [0, len(law)) are i.i.d. draws from law [C]: zero-probability ids never appear,
    chi-square p-value > CHI_SQUARE_ALPHA (ids expected < 5 times pooled into one bin), TV <= tv_bound."""
    law = np.asarray(law, dtype=np.float64)
    law = law / law.sum()
    n = samples.numel()
    counts = np.bincount(samples.cpu().numpy().ravel(), minlength=law.size).astype(np.float64)
    assert counts.size == law.size, f"ids outside [0, {law.size})"
    impossible = counts[law == 0].sum()
    assert impossible == 0, f"{impossible:.0f} draws of zero-probability ids"
    expected = law * n
    small = (expected < 5) & (law > 0)
    big = expected >= 5
    observed_bins = np.append(counts[big], counts[small].sum())
    expected_bins = np.append(expected[big], expected[small].sum())
    if expected_bins[-1] == 0:
        observed_bins, expected_bins = observed_bins[:-1], expected_bins[:-1]
    if observed_bins.size > 1:
        p_value = stats.chisquare(observed_bins, expected_bins).pvalue
        assert p_value > CHI_SQUARE_ALPHA, f"chi-square p = {p_value:.2e}"
    tv = 0.5 * float(np.abs(counts / n - law).sum())
    bound = tv_bound(law, n)
    assert tv <= bound, f"TV {tv:.5f} > bound {bound:.5f} (n = {n})"


def assert_binomial_rate(successes: int, n: int, rate: float, sigmas: float = 5.0) -> None:
    """successes out of n match a success probability `rate` within `sigmas` binomial standard deviations."""
    sd = math.sqrt(max(rate * (1 - rate), 1e-12) / n)
    assert abs(successes / n - rate) <= sigmas * sd + 1e-12, f"rate {successes / n:.5f} vs {rate:.5f} (sd {sd:.5f})"
