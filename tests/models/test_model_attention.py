"""attend(): causal over a cached prefix, explicit masks, non-causal blocks, GQA; CPU and SDPA paths."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdec_cli.models.attention import _attend_cuda, attend


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """float64 softmax attention with HF's repeat_kv head mapping; allowed [n, L] bool."""
    groups = q.shape[1] // k.shape[0]
    k64 = k.double().repeat_interleave(groups, 0)
    v64 = v.double().repeat_interleave(groups, 0)
    scores = torch.einsum("nhd,hld->hnl", q.double(), k64) * q.shape[-1] ** -0.5
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hnl,hld->nhd", probs, v64).float()


def _qkv(n: int, seq: int, heads: int = 6, kv_heads: int = 2, dim: int = 8) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(n * 1000 + seq)
    shapes = ((n, heads, dim), (kv_heads, seq, dim), (kv_heads, seq, dim))
    return tuple(torch.randn(shape, generator=gen) for shape in shapes)


@pytest.mark.parametrize(("n", "seq", "kv_heads"), [(1, 7, 2), (5, 12, 2), (9, 300, 1), (4, 4, 6)])
def test_causal_over_a_cached_prefix(n: int, seq: int, kv_heads: int) -> None:
    q, k, v = _qkv(n, seq, kv_heads=kv_heads)
    allowed = torch.ones(n, seq, dtype=torch.bool).tril(seq - n)
    out = attend(q, k, v, scale=q.shape[-1] ** -0.5, causal=True)
    torch.testing.assert_close(out, _reference(q, k, v, allowed), rtol=0, atol=1e-5)


def test_non_causal_block_and_explicit_mask() -> None:
    q, k, v = _qkv(4, 10)
    full = attend(q, k, v, scale=q.shape[-1] ** -0.5, causal=False)
    torch.testing.assert_close(full, _reference(q, k, v, torch.ones(4, 10, dtype=torch.bool)), rtol=0, atol=1e-5)
    mask = torch.rand(4, 10, generator=torch.Generator().manual_seed(0)) > 0.4
    mask[:, 0] = True
    masked = attend(q, k, v, scale=q.shape[-1] ** -0.5, causal=False, mask=mask)
    torch.testing.assert_close(masked, _reference(q, k, v, mask), rtol=0, atol=1e-5)
    both = attend(q, k, v, scale=q.shape[-1] ** -0.5, causal=True, mask=mask)
    causal = torch.ones(4, 10, dtype=torch.bool).tril(6)
    torch.testing.assert_close(both, _reference(q, k, v, mask & causal), rtol=0, atol=1e-5)


def test_query_chunking_of_long_prefills_matches_sdpa() -> None:
    q, k, v = _qkv(600, 640, kv_heads=3)
    out = attend(q, k, v, scale=0.3, causal=True)
    allowed = torch.ones(600, 640, dtype=torch.bool).tril(40)
    ref = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=allowed, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(out, ref.transpose(0, 1), rtol=0, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_sdpa_fallback_path_agrees(causal: bool) -> None:
    """The CUDA path without flashinfer (SDPA, explicit mask) is plain torch: check it on CPU."""
    q, k, v = _qkv(5, 11)
    kwargs = dict(scale=q.shape[-1] ** -0.5, causal=causal)
    torch.testing.assert_close(_attend_cuda(q, k, v, mask=None, **kwargs), attend(q, k, v, **kwargs), rtol=0, atol=1e-5)


def test_a_decoder_layer_trains_with_its_own_cache() -> None:
    """Drafters (EAGLE-3 head, MTP layer) train these blocks: gradients reach every weight."""
    from model_factories import tiny_hf, to_ours

    from specdec_cli.models.layers import DecoderLayer, RaggedBatch

    model = to_ours(tiny_hf("llama", layers=1))
    layer: DecoderLayer = model.layers[0].requires_grad_(True)
    with torch.inference_mode():  # a causal bias cached under inference mode must still work below
        model(model.new_cache(1, 8), [0], torch.arange(5))
    cache = model.new_cache(2, 8)
    batch = RaggedBatch.build([0, 1], [0, 0], [5, 5], model.rope)
    x = torch.randn(10, 64, requires_grad=True)
    layer(x, batch, *cache.layer(0)).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


@pytest.mark.parametrize("groups", [1, 2, 3])
@pytest.mark.parametrize("n", [2, 5, 13])
@pytest.mark.parametrize("seq, dim", [(300, 64), (14, 64), (8, 16)])
def test_a_verify_block_rounds_each_query_as_its_single_token_decode(groups: int, n: int, seq: int, dim: int) -> None:
    """Row invariance: query i of an n-token block gives bitwise what it gives decoded alone over the same keys
    (SmolLM2's 9 heads over 3 KV heads are groups=3: a decode is then 3 GEMM rows, padded per CPU); short
    contexts too, where the GEMM and softmax would round differently below MIN_KEYS keys."""
    seq = max(seq, n)
    q, k, v = _qkv(n, seq, heads=3 * groups, kv_heads=3, dim=dim)
    block = attend(q, k, v, scale=dim**-0.5, causal=True)
    for i in range(n):
        visible = seq - n + i + 1
        alone = attend(q[i : i + 1], k[:, :visible], v[:, :visible], scale=dim**-0.5, causal=True)
        assert torch.equal(block[i : i + 1], alone), f"query {i} of {n} rounds differently from its decode"
