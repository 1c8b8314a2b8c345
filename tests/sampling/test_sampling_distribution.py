"""Statistical tests: what rejection sampling emits is distributed exactly as the target.

Each case draws 10^6 rows in one call and checks chi-square and a TV bound sized to the sample
(see sampling_stats). Drafts are drawn with torch.multinomial, independently of the code under test.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sampling_stats import assert_binomial_rate, assert_law

from specdec_cli.sampling import probs_from_logits, rejection_sample, sample_from_probs

ROWS = 1_000_000
VOCAB = 16


def normalised(weights: torch.Tensor) -> torch.Tensor:
    return (weights / weights.sum()).float()


def law_pair(case: str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(target [V], draft [V]) for one named case."""
    def peaked() -> torch.Tensor:
        return normalised((3 * torch.randn(VOCAB, generator=generator)).softmax(0))

    def near_uniform() -> torch.Tensor:
        return normalised(1 + 0.1 * torch.rand(VOCAB, generator=generator))

    if case == "peaked":
        return peaked(), peaked()
    if case == "near-uniform":
        return near_uniform(), near_uniform()
    if case == "disjoint-support":
        weights = torch.rand(VOCAB, generator=generator) + 0.1
        return normalised(weights * (torch.arange(VOCAB) < 8)), normalised(weights * (torch.arange(VOCAB) >= 8))
    if case == "equal":
        target = peaked()
        return target, target.clone()
    if case == "one-hot-draft":
        return near_uniform(), torch.nn.functional.one_hot(torch.tensor(5), VOCAB).float()
    if case == "draft-with-zeros":
        target, draft = near_uniform(), near_uniform()
        target[[0, 1, 2]] = 0
        draft[[2, 3, 4, 5, 6]] = 0
        return normalised(target), normalised(draft)
    raise ValueError(case)


@pytest.mark.parametrize(
    "case", ["peaked", "near-uniform", "disjoint-support", "equal", "one-hot-draft", "draft-with-zeros"]
)
def test_emitted_tokens_follow_the_target(case):
    generator = torch.Generator().manual_seed(sum(map(ord, case)))
    target, draft = law_pair(case, generator)
    k = 2
    draft_tokens = torch.multinomial(draft, ROWS * k, replacement=True, generator=generator).view(ROWS, k)
    tokens, emitted = rejection_sample(
        target.expand(ROWS, k + 1, VOCAB), draft.expand(ROWS, k, VOCAB), draft_tokens, generator
    )
    assert_law(tokens[:, 0], target)
    first_accepted = emitted >= 2
    assert_binomial_rate(int(first_accepted.sum()), ROWS, float(torch.minimum(target, draft).sum()))
    if first_accepted.any():  # positions are independent here, so the next token follows the target too
        assert_law(tokens[first_accepted, 1], target)


def truncated_law(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """float64 top-k -> softmax(logits / T) -> top-p, written independently of probs_from_logits."""
    order = np.argsort(-logits)[:top_k]
    weights = np.exp((logits[order] - logits[order[0]]) / temperature)
    weights /= weights.sum()
    kept = int(np.searchsorted(np.cumsum(weights), top_p)) + 1  # smallest prefix with mass >= top_p
    law = np.zeros_like(logits)
    law[order[:kept]] = weights[:kept] / weights[:kept].sum()
    return law


def test_filtered_target_and_draft_emit_the_truncated_renormalised_target():
    generator = torch.Generator().manual_seed(11)
    vocab, k = 32, 2
    target_logits = 2 * torch.randn(vocab, generator=generator, dtype=torch.float64)
    draft_logits = target_logits + torch.randn(vocab, generator=generator, dtype=torch.float64)
    target_filters, draft_filters = (0.8, 12, 0.85), (1.3, 20, 0.95)

    def filtered(logits: torch.Tensor, filters: tuple[float, int, float]) -> torch.Tensor:
        temperature, top_k, top_p = filters
        return probs_from_logits(
            logits.float()[None], torch.tensor([temperature]), torch.tensor([top_k]), torch.tensor([top_p])
        )[0]

    target, draft = filtered(target_logits, target_filters), filtered(draft_logits, draft_filters)
    law = truncated_law(target_logits.numpy(), *target_filters)
    np.testing.assert_allclose(target.numpy(), law, atol=2e-6)
    assert 3 <= int((law > 0).sum()) < 12  # top-p really truncates inside the top-k set
    draft_tokens = torch.multinomial(draft, ROWS * k, replacement=True, generator=generator).view(ROWS, k)
    target_probs, draft_probs = target.expand(ROWS, k + 1, vocab), draft.expand(ROWS, k, vocab)
    tokens, _ = rejection_sample(target_probs, draft_probs, draft_tokens, generator)
    assert_law(tokens[:, 0], law)


def test_chain_with_prefix_dependent_target_gives_the_joint_law_of_two_tokens():
    generator = torch.Generator().manual_seed(12)
    vocab, k = 6, 2

    def table(*shape: int, sharpness: float = 2.0) -> torch.Tensor:
        return (sharpness * torch.randn(*shape, vocab, generator=generator)).softmax(-1)

    target_1, target_2, target_3 = table(), table(vocab), table(vocab, vocab)
    draft_1, draft_2 = table(sharpness=1.0), table(vocab, sharpness=1.0)
    draft_2[:, 0] = 0  # a draft that can never propose id 0 at position 2
    draft_2 /= draft_2.sum(-1, keepdim=True)

    d1 = torch.multinomial(draft_1, ROWS, replacement=True, generator=generator)
    d2 = torch.multinomial(draft_2[d1], 1, generator=generator)[:, 0]
    target_probs = torch.stack([target_1.expand(ROWS, vocab), target_2[d1], target_3[d1, d2]], dim=1)
    draft_probs = torch.stack([draft_1.expand(ROWS, vocab), draft_2[d1]], dim=1)
    tokens, emitted = rejection_sample(target_probs, draft_probs, torch.stack([d1, d2], 1), generator)

    first = tokens[:, 0]
    # Where only one token was emitted, the next step would draw the second token from target_2(. | first).
    next_step = torch.multinomial(target_2[first], 1, generator=generator)[:, 0]
    second = torch.where(emitted >= 2, tokens[:, 1], next_step)
    joint_law = (target_1[:, None] * target_2).flatten()
    assert_law(first * vocab + second, joint_law)
    assert 0.2 < float((emitted >= 2).float().mean()) < 0.9


def test_sample_from_probs_follows_unnormalised_weights():
    generator = torch.Generator().manual_seed(13)
    weights = torch.rand(VOCAB, generator=generator) ** 2 * 7.0
    weights[3] = 0
    assert_law(sample_from_probs(weights.expand(ROWS, VOCAB), generator), weights / weights.sum())


def test_sample_from_probs_across_vocabulary_chunks():
    generator = torch.Generator().manual_seed(14)
    vocab, rows = 20_000, 4_000
    ids = torch.tensor([0, 255, 256, 4095, 4096, 12287, 19967, 19999])  # around chunk and block edges
    weights = torch.zeros(vocab)
    weights[ids] = torch.tensor([1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0])
    samples = sample_from_probs(weights.expand(rows, vocab), generator)
    assert torch.isin(samples, ids).all()
    assert_law(torch.searchsorted(ids, samples), weights[ids])
