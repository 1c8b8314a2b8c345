"""The oneDNN-prepacked Linear: matches F.linear, is row-invariant, repacks after weight updates."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from model_factories import random_linear
import torch.nn.functional as F

from specdec_cli.models.fast_linear import Linear, LinearGroup, onednn_available

# the SmolLM2 shapes: q/o, k/v, gate/up, down, (a slice of) the LM head
SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 4096)]


def _linear(in_f: int, out_f: int, bias: bool = False, seed: int = 0) -> Linear:
    return random_linear(in_f, out_f, bias, seed)


def test_onednn_ops_exist_in_this_torch() -> None:
    assert onednn_available(), "torch.ops.mkldnn linear ops missing: decode falls back to slower F.linear"


@pytest.mark.parametrize(("in_f", "out_f"), SHAPES)
def test_matches_f_linear(in_f: int, out_f: int) -> None:
    layer = _linear(in_f, out_f, bias=True)
    x = torch.randn(7, in_f)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=1e-5)
    assert layer(x[:1, None]).shape == (1, 1, out_f)


@pytest.mark.parametrize(("in_f", "out_f"), SHAPES)
def test_a_row_does_not_depend_on_the_other_rows(in_f: int, out_f: int) -> None:
    layer = _linear(in_f, out_f)
    x = torch.randn(40, in_f)
    full = layer(x)
    for rows in (1, 2, 3, 5, 9, 17):
        part = layer(x[:rows])
        torch.testing.assert_close(part, full[:rows], rtol=0, atol=1e-5)
        if not torch.equal(part, full[:rows]):
            warnings.warn(f"Linear {in_f}->{out_f}: {rows} rows round differently from 40 rows on this CPU")


def test_repacks_when_the_weight_changes_and_trains_through_f_linear() -> None:
    layer = _linear(64, 32)
    x = torch.randn(3, 64)
    before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)
    torch.testing.assert_close(layer(x), 2 * before, rtol=1e-6, atol=1e-6)
    layer.requires_grad_(True)
    layer(x).sum().backward()
    assert layer.weight.grad is not None


def test_copies_and_replaced_weights_never_reuse_a_stale_packed_weight() -> None:
    layer = _linear(64, 32, bias=True)
    x = torch.randn(3, 64)
    before = layer(x)
    twin = copy.deepcopy(layer)  # the opaque oneDNN tensor is dropped, then rebuilt
    assert torch.equal(twin(x), before) and twin._packed._linears[0] is twin
    layer.weight = torch.nn.Parameter(torch.zeros(32, 64), requires_grad=False)
    torch.testing.assert_close(layer(x), layer.bias.expand(3, -1), rtol=0, atol=0)


def test_a_group_equals_its_members() -> None:
    q, k = _linear(64, 48, bias=True, seed=1), _linear(64, 16, bias=True, seed=2)
    group = LinearGroup(q, k)
    x = torch.randn(5, 64)
    for out, member in zip(group(x), (q, k)):
        torch.testing.assert_close(out, member(x), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="same input size"):
        LinearGroup(q, _linear(32, 8))
