"""Seeded rows are reproducible and batch-invariant; draws are exact at one-hot rows and chunk edges."""
from __future__ import annotations

import pytest
import torch

from specdec_cli.sampling import SamplingError, draw_uniforms, rejection_sample, sample_from_probs


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def batch_inputs(batch: int, k: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = seeded(seed)
    target = torch.randn(batch, k + 1, vocab, generator=generator).softmax(-1)
    draft = (target[:, :k].log() + torch.randn(batch, k, vocab, generator=generator)).softmax(-1)
    draft_tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=generator).view(batch, k)
    return target, draft, draft_tokens


def test_draw_uniforms_per_row_streams_ignore_the_rest_of_the_batch():
    alone = draw_uniforms((3,), [seeded(7)], num_rows=1, device="cpu")
    mixed = draw_uniforms((3,), [None, seeded(1), seeded(7), None], num_rows=4, device="cpu")
    assert alone.dtype == torch.float64 and alone.shape == (1, 3)
    assert torch.equal(mixed[2], alone[0])
    assert ((mixed >= 0) & (mixed < 1)).all()
    with pytest.raises(SamplingError):
        draw_uniforms((3,), [None], num_rows=2, device="cpu")


def test_sample_from_probs_is_batch_invariant_for_seeded_rows():
    # 40k tokens: one pass-1 block for a single row, several for the batch of 16.
    batch = 16
    probs = torch.rand(batch, 40_000, generator=seeded(0)) ** 4
    for row in range(0, batch, 3):
        alone = sample_from_probs(probs[row : row + 1], [seeded(100 + row)])

        def batch_generators() -> list[torch.Generator | None]:
            return [seeded(100 + i) if i == row else (seeded(i) if i % 2 else None) for i in range(batch)]

        assert sample_from_probs(probs, batch_generators())[row] == alone[0]
        assert sample_from_probs(probs.flip(0), batch_generators()[::-1])[batch - 1 - row] == alone[0]


def test_sample_from_probs_with_one_generator_is_reproducible():
    probs = torch.rand(50, 30, generator=seeded(1))
    assert torch.equal(sample_from_probs(probs, seeded(3)), sample_from_probs(probs, seeded(3)))


def test_rejection_sample_is_batch_invariant_for_seeded_rows():
    batch, k, vocab = 12, 3, 40_000
    target, draft, draft_tokens = batch_inputs(batch, k, vocab, seed=2)
    generators = [seeded(50 + i) for i in range(batch)]
    full_tokens, full_emitted = rejection_sample(target, draft, draft_tokens, generators=generators)
    for row in range(batch):
        tokens, emitted = rejection_sample(
            target[row : row + 1], draft[row : row + 1], draft_tokens[row : row + 1], generators=[seeded(50 + row)]
        )
        assert torch.equal(tokens[0], full_tokens[row]) and emitted[0] == full_emitted[row]
    assert len(set(full_emitted.tolist())) > 1  # the rows really took different paths


def test_rejection_sample_with_one_generator_is_reproducible():
    target, draft, draft_tokens = batch_inputs(20, 4, 100, seed=3)
    first = rejection_sample(target, draft, draft_tokens, seeded(9))
    second = rejection_sample(target, draft, draft_tokens, generator=seeded(9))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


@pytest.mark.parametrize("token", [0, 255, 256, 4095, 4096, 19967, 19968, 19999])
def test_one_hot_rows_return_their_argmax_exactly_at_chunk_edges(token):
    probs = torch.zeros(64, 20_000)
    probs[:, token] = 1.0
    assert (sample_from_probs(probs, seeded(token)) == token).all()
