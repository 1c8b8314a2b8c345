"""probs_from_logits filters and edge cases; draft-vocabulary expansion."""
from __future__ import annotations

import math

import pytest
import torch

from specdec_cli.sampling import SamplingError, draft_to_target_ids, expand_draft_probs, probs_from_logits

INF = float("inf")


def one_row(
    logits: list[float], temperature: float, top_k: int | None = None, top_p: float | None = None
) -> list[float]:
    out = probs_from_logits(
        torch.tensor([logits]),
        torch.tensor([temperature]),
        None if top_k is None else torch.tensor([top_k]),
        None if top_p is None else torch.tensor([top_p]),
    )
    assert out.dtype == torch.float32
    return out[0].tolist()


def softmax(values: list[float]) -> list[float]:
    exps = [math.exp(v) for v in values]
    return [e / sum(exps) for e in exps]


def test_temperature_zero_is_exact_one_hot_at_lowest_tied_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, -2.0], [0.0, 0.0, 0.0, 0.0], [5.0, 1.0, 4.9999, -INF]])
    probs = probs_from_logits(logits, torch.zeros(3), torch.tensor([2, 1, 0]), torch.tensor([0.5, 0.1, 1.0]))
    assert probs.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]]
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))


def test_no_filters_is_tempered_softmax():
    logits = [2.0, 1.0, 0.0, -1.0]
    assert one_row(logits, 1.0) == pytest.approx(softmax(logits), abs=1e-6)
    assert one_row(logits, 0.5) == pytest.approx(softmax([2 * v for v in logits]), abs=1e-6)


@pytest.mark.parametrize("top_k", [0, -3, 4, 100])
def test_top_k_off_values_keep_everything(top_k):
    logits = [2.0, 1.0, 0.0, -1.0]
    assert one_row(logits, 1.0, top_k=top_k) == pytest.approx(softmax(logits), abs=1e-6)


def test_top_k_masks_before_the_softmax_and_keeps_boundary_ties():
    assert one_row([2.0, 1.0, 0.0, -1.0], 1.0, top_k=2) == pytest.approx(softmax([2.0, 1.0]) + [0, 0], abs=1e-6)
    assert one_row([2.0, 1.0, 1.0, -1.0], 1.0, top_k=2) == pytest.approx(softmax([2.0, 1.0, 1.0]) + [0], abs=1e-6)


@pytest.mark.parametrize("top_p", [1.0, 1.5])
def test_top_p_at_or_above_one_is_off(top_p):
    logits = [2.0, 1.0, 0.0, -30.0]
    assert one_row(logits, 1.0, top_p=top_p) == pytest.approx(softmax(logits), abs=1e-7)


def test_top_p_keeps_smallest_prefix_reaching_the_mass():
    probs = [0.5, 0.3, 0.15, 0.05]
    logits = [math.log(p) for p in probs]
    assert one_row(logits, 1.0, top_p=0.75) == pytest.approx([0.625, 0.375, 0, 0], abs=1e-6)
    assert one_row(logits, 1.0, top_p=0.85) == pytest.approx([p / 0.95 for p in probs[:3]] + [0], abs=1e-6)


@pytest.mark.parametrize("top_p", [1e-9, 0.0, -1.0])
def test_tiny_top_p_keeps_the_top_token(top_p):
    assert one_row([0.0, 3.0, 1.0], 1.0, top_p=top_p) == [0, 1, 0]


def test_filters_apply_in_order_top_k_then_temperature_then_top_p():
    logits = [3.0, 2.0, 1.0, 0.0, -1.0]
    # top-k 3 keeps ids 0..2; at T = 2 their probs are softmax([1.5, 1, 0.5]) = [0.506, 0.307, 0.186];
    # top-p 0.6 then keeps ids 0 and 1.
    kept = softmax([1.5, 1.0])
    assert one_row(logits, 2.0, top_k=3, top_p=0.6) == pytest.approx(kept + [0, 0, 0], abs=1e-6)


def test_rows_use_their_own_parameters():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]]).repeat(4, 1)
    probs = probs_from_logits(
        logits, torch.tensor([0.0, 1.0, 1.0, 1.0]), torch.tensor([0, 2, 0, 0]), torch.tensor([1.0, 1.0, 0.5, 1.0])
    )
    assert probs[0].tolist() == [1, 0, 0, 0]
    assert probs[1].tolist() == pytest.approx(softmax([3.0, 2.0]) + [0, 0], abs=1e-6)
    assert probs[2].tolist() == [1, 0, 0, 0]  # the top token alone holds 0.64 >= 0.5
    assert probs[3].tolist() == pytest.approx(softmax([3.0, 2.0, 1.0, 0.0]), abs=1e-6)


def test_tiny_temperature_and_masked_tokens_stay_finite():
    probs = probs_from_logits(torch.tensor([[1.0, 1.5, -INF]]), torch.tensor([1e-30]))
    assert probs.tolist() == [[0, 1, 0]]


@pytest.mark.parametrize(
    "bad_row",
    [[float("nan")] * 3, [-INF] * 3, [0.0, float("nan"), 1.0], [0.0, INF, 1.0]],
    ids=["nan", "-inf", "some-nan", "+inf"],
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_without_a_finite_maximum_raise(bad_row, temperature):
    logits = torch.tensor([[0.0, 1.0, 2.0], bad_row])
    with pytest.raises(SamplingError, match="row 1"):
        probs_from_logits(logits, torch.full((2,), temperature), torch.tensor([2, 2]), torch.tensor([0.9, 0.9]))


@pytest.mark.parametrize("temperature", [-0.5, float("nan"), INF])
def test_invalid_temperature_raises(temperature):
    with pytest.raises(SamplingError, match="temperature"):
        probs_from_logits(torch.zeros(1, 4), torch.tensor([temperature]))


def test_parameters_must_have_one_value_per_row():
    with pytest.raises(SamplingError, match="top_k"):
        probs_from_logits(torch.zeros(2, 4), torch.ones(2), torch.tensor([1]))
    with pytest.raises(SamplingError, match="temperature"):
        probs_from_logits(torch.zeros(2, 4), torch.tensor(1.0))


def test_sampling_error_is_a_value_error():
    assert issubclass(SamplingError, ValueError)


def test_expand_draft_probs_identity_and_padding():
    draft = torch.rand(2, 3, 5)
    assert expand_draft_probs(draft, None, 5) is draft
    padded = expand_draft_probs(draft, None, 8)
    assert padded.shape == (2, 3, 8) and torch.equal(padded[..., :5], draft) and not padded[..., 5:].any()
    with pytest.raises(SamplingError):
        expand_draft_probs(draft, None, 4)


def test_expand_draft_probs_with_d2t_offsets():
    d2t = torch.tensor([0, 1, 3, 5])  # draft ids 0, 1, 2, 3 -> target ids 0, 2, 5, 8
    draft = torch.tensor([[[0.1, 0.2, 0.3, 0.4]]])
    expanded = expand_draft_probs(draft, d2t, 10)
    assert expanded[0, 0].tolist() == pytest.approx([0.1, 0, 0.2, 0, 0, 0.3, 0, 0, 0.4, 0])
    assert draft_to_target_ids(torch.tensor([[3, 0, 2]]), d2t).tolist() == [[8, 0, 5]]
    assert draft_to_target_ids(torch.tensor([1]), None).tolist() == [1]


@pytest.mark.parametrize(
    "d2t", [[0, 1, 3, 7], [-1, 0, 0, 0], [1, 0, 0, 0]], ids=["out-of-range", "negative", "collision"]
)
def test_expand_draft_probs_rejects_bad_maps(d2t):
    with pytest.raises(SamplingError, match="distinct"):
        expand_draft_probs(torch.rand(1, 1, 4), torch.tensor(d2t), 10)


def test_expand_draft_probs_checks_a_map_once_and_again_after_an_in_place_change():
    d2t = torch.tensor([0, 1, 3, 5])
    draft = torch.rand(1, 2, 4)
    first = expand_draft_probs(draft, d2t, 10)
    assert torch.equal(expand_draft_probs(draft, d2t, 10), first)
    with pytest.raises(SamplingError, match="distinct"):
        expand_draft_probs(draft, d2t, 8)  # the same map against a smaller vocabulary: 3 + 5 is out of range
    d2t[3] = -1  # draft id 3 -> target id 2, already draft id 1's
    with pytest.raises(SamplingError, match="distinct"):
        expand_draft_probs(draft, d2t, 10)
