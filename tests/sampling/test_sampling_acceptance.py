"""Exact vectors for the acceptance rules, vectorised == float64 reference, and no host syncs."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specdec_cli.sampling import (
    SamplingError,
    greedy_accept,
    rejection_sample,
    rejection_sample_reference,
    relaxed_accept,
    sample_from_probs,
    strict_accept,
)


def one_hot(ids: list[list[int]], vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(ids), vocab).float()


def random_probs(shape: tuple[int, ...], generator: torch.Generator, zero_fraction: float = 0.3) -> torch.Tensor:
    """Peaked rows with exact zeros, normalised in float32."""
    probs = torch.rand(shape, generator=generator) ** 3
    probs = probs * (torch.rand(shape, generator=generator) > zero_fraction)
    probs[..., 0] += 1e-3  # no all-zero rows
    return probs / probs.sum(-1, keepdim=True)


def test_one_hot_rows_all_accepted_emit_drafts_and_bonus():
    target = one_hot([[3, 1, 4, 1]], 6)
    tokens, emitted = rejection_sample(target, one_hot([[3, 1, 4]], 6), torch.tensor([[3, 1, 4]]))
    assert tokens.tolist() == [[3, 1, 4, 1]] and emitted.tolist() == [4]
    assert tokens.dtype == emitted.dtype == torch.int64


def test_one_hot_rows_early_mismatch_emit_the_target_token_then_padding():
    target = one_hot([[3, 1, 4, 1]], 6)
    tokens, emitted = rejection_sample(target, one_hot([[3, 2, 4]], 6), torch.tensor([[3, 2, 4]]))
    assert tokens.tolist() == [[3, 1, -1, -1]] and emitted.tolist() == [2]


def test_one_hot_rows_give_ragged_lengths_equal_to_strict_acceptance():
    generator = torch.Generator().manual_seed(0)
    batch, k, vocab = 400, 4, 3  # a tiny vocabulary makes every prefix length common
    target_tokens = torch.randint(vocab, (batch, k + 1), generator=generator)
    draft_tokens = torch.randint(vocab, (batch, k), generator=generator)
    tokens, emitted = rejection_sample(
        one_hot(target_tokens.tolist(), vocab), one_hot(draft_tokens.tolist(), vocab), draft_tokens, generator
    )
    strict_tokens, strict_emitted = strict_accept(draft_tokens, target_tokens)
    assert torch.equal(tokens, strict_tokens) and torch.equal(emitted, strict_emitted)
    assert set(emitted.tolist()) == set(range(1, k + 2))
    assert torch.equal(emitted, (tokens != -1).sum(1))


def test_k_zero_emits_one_bonus_token():
    no_drafts = torch.zeros(2, 0, dtype=torch.int64)
    tokens, emitted = rejection_sample(one_hot([[2], [0]], 4), torch.zeros(2, 0, 4), no_drafts)
    assert tokens.tolist() == [[2], [0]] and emitted.tolist() == [1, 1]


def test_empty_batch():
    tokens, emitted = rejection_sample(torch.rand(0, 3, 8), torch.rand(0, 2, 8), torch.zeros(0, 2, dtype=torch.int64))
    assert tokens.shape == (0, 3) and emitted.shape == (0,)
    assert sample_from_probs(torch.rand(0, 8)).shape == (0,)


@pytest.mark.parametrize("draft_prob_at_draft", [1.0, 0.5, 1e-30])
def test_draft_with_zero_target_prob_is_never_accepted_even_with_u_zero(draft_prob_at_draft):
    target = torch.tensor([[[0.0, 0.6, 0.4], [1.0, 0.0, 0.0]]])
    draft = torch.tensor([[[draft_prob_at_draft, 0.0, 1.0 - draft_prob_at_draft]]])
    tokens, emitted = rejection_sample(target, draft, torch.tensor([[0]]), uniforms=torch.zeros(1, 1))
    assert emitted.tolist() == [1] and tokens[0, 0] in (1, 2) and tokens[0, 1] == -1


def test_u_zero_accepts_any_draft_the_target_can_produce():
    target = torch.tensor([[[1e-30, 0.5, 0.5], [0.0, 0.0, 1.0]]])
    draft = torch.tensor([[[1.0, 0.0, 0.0]]])
    tokens, emitted = rejection_sample(target, draft, torch.tensor([[0]]), uniforms=torch.zeros(1, 2))
    assert tokens.tolist() == [[0, 2]] and emitted.tolist() == [2]


def test_equal_target_and_draft_accept_everything_without_nan():
    generator = torch.Generator().manual_seed(1)
    batch, k, vocab = 2000, 3, 7
    probs = random_probs((batch, k + 1, vocab), generator)
    draft_tokens = sample_from_probs(probs[:, :k].reshape(-1, vocab), generator).view(batch, k)
    nearly_one = torch.full((batch, k + 1), 1 - 2.0**-53, dtype=torch.float64)
    for uniforms in (None, nearly_one):
        tokens, emitted = rejection_sample(probs, probs[:, :k].clone(), draft_tokens, generator, uniforms=uniforms)
        assert (emitted == k + 1).all() and torch.equal(tokens[:, :k], draft_tokens)
        assert ((tokens >= 0) & (tokens < vocab)).all()


def test_flashinfer_docstring_example_is_deterministic():
    draft = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]])
    target = torch.tensor([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]])
    for seed in range(5):
        tokens, emitted = rejection_sample(target, draft, torch.tensor([[2, 1]]), torch.Generator().manual_seed(seed))
        assert tokens.tolist() == [[2, 0, -1]] and emitted.tolist() == [2]


@pytest.mark.parametrize("vocab", [50, 20_000], ids=["one-chunk", "five-chunks"])
@pytest.mark.parametrize("k", [0, 1, 4])
def test_vectorised_matches_float64_reference_for_identical_uniforms(vocab, k):
    generator = torch.Generator().manual_seed(vocab + k)
    batch = 300 if vocab < 1000 else 40
    target = random_probs((batch, k + 1, vocab), generator)
    draft = random_probs((batch, k, vocab), generator)
    # Half the rows draft from a mix close to the target so that acceptances are common.
    draft[: batch // 2] = 0.5 * draft[: batch // 2] + 0.5 * target[: batch // 2, :k]
    draft_tokens = sample_from_probs(draft.reshape(-1, vocab), generator).view(batch, k)
    uniforms = torch.rand(batch, k + 1, generator=generator, dtype=torch.float64)
    tokens, emitted = rejection_sample(target, draft, draft_tokens, uniforms=uniforms)
    ref_tokens, ref_emitted = rejection_sample_reference(target, draft, draft_tokens, uniforms)
    assert torch.equal(tokens, ref_tokens) and torch.equal(emitted, ref_emitted)
    if k:
        assert 1 < emitted.float().mean() < k + 1


def test_uniforms_for_the_tests_only_take_the_final_draw_from_the_generator():
    generator = torch.Generator().manual_seed(3)
    batch, k, vocab = 200, 2, 9
    target, draft = random_probs((batch, k + 1, vocab), generator), random_probs((batch, k, vocab), generator)
    draft_tokens = sample_from_probs(draft.reshape(-1, vocab), generator).view(batch, k)
    tests = torch.rand(batch, k, generator=generator)
    tokens, _ = rejection_sample(target, draft, draft_tokens, torch.Generator().manual_seed(9), uniforms=tests)
    final = torch.rand(batch, 1, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    expected, _ = rejection_sample_reference(target, draft, draft_tokens, torch.cat([tests.double(), final], 1))
    assert torch.equal(tokens, expected)


def test_rejection_sample_rejects_inconsistent_inputs():
    target, draft, ids = torch.rand(2, 3, 5), torch.rand(2, 2, 5), torch.zeros(2, 2, dtype=torch.int64)
    with pytest.raises(SamplingError):
        rejection_sample(target, draft[:, :1], ids)
    with pytest.raises(SamplingError):
        rejection_sample(target, draft, ids[:, :1])
    with pytest.raises(SamplingError):
        rejection_sample(target, draft, ids, uniforms=torch.zeros(2, 4))
    with pytest.raises(SamplingError):
        rejection_sample(target, draft, ids, torch.Generator(), generators=[None, None])


def test_strict_accept_vectors():
    draft = torch.tensor([[5, 6, 7], [5, 0, 7], [1, 6, 7]])
    target = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]])
    tokens, emitted = strict_accept(draft, target)
    assert tokens.tolist() == [[5, 6, 7, 8], [5, 6, -1, -1], [5, -1, -1, -1]]
    assert emitted.tolist() == [4, 2, 1]
    tokens, emitted = strict_accept(torch.zeros(2, 0, dtype=torch.int64), torch.tensor([[4], [2]]))
    assert tokens.tolist() == [[4], [2]] and emitted.tolist() == [1, 1]


def test_greedy_accept_uses_the_target_argmax():
    logits = torch.tensor([[[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 9.0]]])
    tokens, emitted = greedy_accept(torch.tensor([[1, 2]]), logits)
    assert tokens.tolist() == [[1, 0, -1]] and emitted.tolist() == [2]


def test_relaxed_accept_top_k_window_and_delta():
    # One position scored by [0.5, 0.3, 0.15, 0.05]; bonus row irrelevant. target_tokens = argmax = 0.
    target = torch.tensor([[[0.5, 0.3, 0.15, 0.05], [0.0, 0.0, 0.0, 1.0]]]).repeat(4, 1, 1)
    target_tokens = torch.tensor([[0, 3]]).repeat(4, 1)
    drafts = torch.tensor([[0], [1], [2], [3]])

    def emitted(topk: int, delta: float) -> list[int]:
        return relaxed_accept(drafts, target, target_tokens, topk, delta)[1].tolist()

    assert emitted(1, 0.0) == [2, 1, 1, 1]  # only the argmax: strict acceptance
    assert emitted(2, 0.25) == [2, 2, 1, 1]  # 0.3 >= 0.5 - 0.25; id 2 is outside the top-2
    assert emitted(2, 0.1) == [2, 1, 1, 1]  # 0.3 < 0.5 - 0.1
    assert emitted(4, 1.0) == [2, 2, 2, 2]
    tokens, _ = relaxed_accept(drafts, target, target_tokens, 2, 0.25)
    assert tokens.tolist() == [[0, 3], [1, 3], [0, -1], [0, -1]]


def test_relaxed_accept_always_accepts_the_target_token_and_validates():
    target = torch.tensor([[[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]]])
    tokens, emitted = relaxed_accept(torch.tensor([[2]]), target, torch.tensor([[2, 0]]), 1, 0.0)
    assert tokens.tolist() == [[2, 0]] and emitted.tolist() == [2]
    with pytest.raises(SamplingError):
        relaxed_accept(torch.tensor([[2]]), target, torch.tensor([[2, 0]]), 0, 0.0)
    with pytest.raises(SamplingError):
        relaxed_accept(torch.tensor([[2]]), target, torch.tensor([[2, 0]]), 1, -0.1)


class HostSyncDetector(TorchDispatchMode):
    """Records aten ops that read tensor values back to the host or have data-dependent output shapes."""

    SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "is_nonzero", "equal", "argwhere")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split("::")[-1].split(".")[0]
        if any(name.startswith(op) for op in self.SYNC_OPS):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def test_acceptance_rules_never_sync_with_the_host():
    generator = torch.Generator().manual_seed(4)
    batch, k, vocab = 8, 3, 20_000
    target, draft = random_probs((batch, k + 1, vocab), generator), random_probs((batch, k, vocab), generator)
    draft_tokens = sample_from_probs(draft.reshape(-1, vocab), generator).view(batch, k)
    target_tokens = target.argmax(-1)
    generators = [torch.Generator().manual_seed(i) if i % 2 else None for i in range(batch)]
    with HostSyncDetector() as detector:
        rejection_sample(target, draft, draft_tokens, generator)
        rejection_sample(target, draft, draft_tokens, generators=generators)
        rejection_sample(target[:, :1], draft[:, :0], draft_tokens[:, :0], generator)
        sample_from_probs(target[:, 0], generators)
        strict_accept(draft_tokens, target_tokens)
        greedy_accept(draft_tokens, target)
        relaxed_accept(draft_tokens, target, target_tokens, 3, 0.1)
    assert detector.seen == []
