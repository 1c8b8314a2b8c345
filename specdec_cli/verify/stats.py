"""Goodness-of-fit statistics for losslessness checks (tests and ``specdec verify``).

A sampler is right when its empirical law matches the target's: chi-square goodness of fit
(cells with small expected counts merged) *and* total variation against a bound calibrated
to the sample size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from scipy import stats as scipy_stats


@dataclass(frozen=True)
class FitResult:
    chi2: float
    dof: int
    p_value: float
    total_variation: float
    tv_bound: float
    num_samples: int

    @property
    def passed(self) -> bool:
        return self.p_value > 1e-4 and self.total_variation <= self.tv_bound


def expected_tv(probs: torch.Tensor, num_samples: int) -> float:
    """E[TV(empirical, probs)] for a correct sampler, by the normal approximation:
    0.5 * sum_i sqrt(2 p_i (1 - p_i) / (pi N))."""
    p = probs.double().clamp(0, 1)
    return float(0.5 * torch.sqrt(2 * p * (1 - p) / (math.pi * num_samples)).sum())


def fit(counts: torch.Tensor, probs: torch.Tensor, *, min_expected: float = 5.0, tv_factor: float = 3.0) -> FitResult:
    """Compare category ``counts`` [C] with the law ``probs`` [C].

    Cells whose expected count is below ``min_expected`` are pooled into one cell. A count in
    a zero-probability cell makes chi2 infinite (p = 0). The TV bound is ``tv_factor`` times
    the expected TV of a correct sampler (plus a 1/N floor).
    """
    counts = counts.double().flatten()
    probs = probs.double().flatten()
    probs = probs / probs.sum()
    total = int(counts.sum())
    tv = 0.5 * float((counts / total - probs).abs().sum())
    bound = tv_factor * expected_tv(probs, total) + 1.0 / total
    if bool(((probs == 0) & (counts > 0)).any()):
        return FitResult(math.inf, 0, 0.0, tv, bound, total)
    expected = probs * total
    big = expected >= min_expected
    observed_cells = torch.cat([counts[big], counts[~big].sum().view(1)])
    expected_cells = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = expected_cells > 0
    observed_cells, expected_cells = observed_cells[keep], expected_cells[keep]
    chi2 = float(((observed_cells - expected_cells) ** 2 / expected_cells).sum())
    dof = max(int(keep.sum()) - 1, 1)
    return FitResult(chi2, dof, float(scipy_stats.chi2.sf(chi2, dof)), tv, bound, total)


def check_three_token_law(samples: torch.Tensor, law: torch.Tensor) -> None:
    """Sampled 3-token continuations ``samples [N, 3]`` follow ``law [V, V, V]`` jointly (chi-square) and per
    position (chi-square + TV, ``verify.stats.fit``); raises AssertionError with the failing fit."""
    vocab = law.shape[0]
    index = (samples[:, 0] * vocab + samples[:, 1]) * vocab + samples[:, 2]
    joint = fit(torch.bincount(index, minlength=law.numel()), law.flatten())
    assert joint.p_value > 1e-4, joint
    for position in range(3):
        marginal = law.sum(dim=[d for d in range(3) if d != position])
        result = fit(torch.bincount(samples[:, position], minlength=vocab), marginal)
        assert result.passed, (position, result)
