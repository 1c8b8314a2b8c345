"""BatchParams (built once per step, read by everyone) and the target-side batched sampling functions."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from specdec_cli.sampling import BatchParams, filtered_probs, probs_from_logits, sample_from_probs, sample_tokens


def _row(temperature: float, top_k: int = 0, top_p: float = 1.0, seed: int | None = None) -> SimpleNamespace:
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return SimpleNamespace(params=SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p),
                           generator=generator)


def test_of_reads_each_row_in_batch_order():
    rows = [_row(0.0), _row(0.7, top_k=5, seed=1), _row(1.0, top_p=0.9)]
    params = BatchParams.of(rows)
    assert torch.equal(params.temperature, torch.tensor([0.0, 0.7, 1.0]))
    assert torch.equal(params.top_k, torch.tensor([0, 5, 0])) and torch.equal(params.top_p, torch.tensor([1.0, 1.0, 0.9]))
    assert params.generators == (None, rows[1].generator, None) and len(params) == 3 and not params.all_greedy
    assert BatchParams.of([_row(0.0), _row(0.0)]).all_greedy


def test_select_and_repeat_rows():
    rows = [_row(0.0), _row(0.7, top_k=5, seed=1), _row(0.0, top_p=0.5)]
    params = BatchParams.of(rows)
    picked = params.select([2, 0])
    assert torch.equal(picked.top_p, torch.tensor([0.5, 1.0])) and picked.all_greedy
    assert picked.generators == (None, None) and not params.select([1]).all_greedy
    repeated = params.repeat_rows(2)
    assert torch.equal(repeated.top_k, torch.tensor([0, 0, 5, 5, 0, 0]))
    assert repeated.generators[2] is repeated.generators[3] is rows[1].generator


def test_filtered_probs_applies_each_rows_filters_at_every_position():
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0))
    params = BatchParams.from_values([0.5, 1.0], [3, 0], [1.0, 0.8], [None, None])
    expected = probs_from_logits(logits.reshape(6, 11), torch.tensor([0.5] * 3 + [1.0] * 3),
                                 torch.tensor([3] * 3 + [0] * 3), torch.tensor([1.0] * 3 + [0.8] * 3))
    assert torch.equal(filtered_probs(logits, params), expected.view(2, 3, 11))


def test_sample_tokens_greedy_batches_take_the_argmax_without_draws():
    logits = torch.randn(3, 2, 11, generator=torch.Generator().manual_seed(1))
    state = torch.random.get_rng_state()
    assert torch.equal(sample_tokens(logits, BatchParams.of([_row(0.0)] * 3)), logits.argmax(-1))
    assert torch.equal(torch.random.get_rng_state(), state)


def test_sample_tokens_draws_per_row_streams_and_keeps_greedy_rows_exact():
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(2))
    params = BatchParams.of([_row(0.0), _row(1.0, seed=7)])
    tokens = sample_tokens(logits, params)
    assert torch.equal(tokens[0], logits[0].argmax(-1))
    expected = sample_from_probs(filtered_probs(logits, params)[1], torch.Generator().manual_seed(7))
    assert torch.equal(tokens[1], expected)
