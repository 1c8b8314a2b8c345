"""The compiled per-row ops of a CPU decoder layer (``row_ops``): what they compute, and that a row's result never
depends on the rows that came with it (the property greedy speculative == greedy autoregressive rests on)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdec_cli.models import attention as attention_module
from specdec_cli.models import row_ops
from specdec_cli.models.attention import attend
from specdec_cli.models.layers import TreeRows
from specdec_cli.models.rope import apply_rotary

KV, HEADS, DIM = 3, 9, 64


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_rms_norm_is_as_accurate_as_torch_and_row_invariant_serial_or_parallel() -> None:
    x = torch.randn(100, 576, generator=_gen()) * 3
    weight = torch.rand(576, generator=_gen(1)) + 0.5
    ours = row_ops.rms_norm(x, weight, 1e-5)
    exact = (weight.double() * x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)).float()
    torch_err = (F.rms_norm(x, (576,), weight, eps=1e-5).double() - exact.double()).abs().max()
    assert (ours.double() - exact.double()).abs().max() <= torch_err
    assert 100 >= row_ops.PARALLEL_MIN_ROWS  # the batch above took the parallel kernel, single rows the serial one
    assert torch.equal(torch.cat([row_ops.rms_norm(x[i : i + 1], weight, 1e-5) for i in range(100)]), ours)


def test_add_rms_norm_is_the_residual_add_then_the_norm() -> None:
    x, delta = torch.randn(2, 7, 48, generator=_gen()), torch.randn(2, 7, 48, generator=_gen(1))
    weight = torch.rand(48, generator=_gen(2))
    h, normed = row_ops.add_rms_norm(x, delta, weight, 1e-6)
    assert torch.equal(h, x + delta) and torch.equal(normed, row_ops.rms_norm(x + delta, weight, 1e-6))


@pytest.mark.parametrize("rows", [1, 5, 40])  # 40: the parallel kernel
def test_rope_store_is_bitwise_the_torch_rotation_and_cache_writes(rows: int) -> None:
    qkv = torch.randn(rows, HEADS + 2 * KV, DIM, generator=_gen())
    q, k, v = qkv.split([HEADS, KV, KV], dim=1)
    angles = torch.rand(rows, 1, DIM // 2, generator=_gen(1)) * 6
    cos, sin = angles.cos(), angles.sin()
    slot_ids, positions = torch.randint(0, 3, (rows,), generator=_gen(2)), torch.randperm(64, generator=_gen(3))[:rows]
    k_cache, v_cache = torch.zeros(3, KV, 64, DIM), torch.zeros(3, KV, 64, DIM)
    got_q = row_ops.rope_store(q, k, v, cos, sin, k_cache, v_cache, slot_ids, positions)
    want_k_cache, want_v_cache = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    want_k_cache.transpose(1, 2)[slot_ids, positions] = apply_rotary(k, cos, sin)
    want_v_cache.transpose(1, 2)[slot_ids, positions] = v
    assert torch.equal(got_q, apply_rotary(q, cos, sin))
    assert torch.equal(k_cache, want_k_cache) and torch.equal(v_cache, want_v_cache)


def _float64_attention(q, k, v, start, scale, visible=None):
    out = torch.empty(q.shape, dtype=torch.float64)
    for i in range(q.shape[0]):
        for h in range(q.shape[1]):
            g, keys = h // (q.shape[1] // k.shape[0]), start + i + 1
            scores = (k[g, :keys].double() @ q[i, h].double()) * scale
            if visible is not None:
                scores[~visible[i, :keys]] = float("-inf")
            out[i, h] = torch.softmax(scores, 0) @ v[g, :keys].double()
    return out


@pytest.mark.parametrize("tree", [False, True])
def test_attend_rows_matches_float64_and_is_row_invariant(tree: bool) -> None:
    n, start, scale = 6, 290, DIM**-0.5
    k, v = torch.randn(KV, 320, DIM, generator=_gen()), torch.randn(KV, 320, DIM, generator=_gen(1))
    q = torch.randn(n, HEADS, DIM, generator=_gen(2)) * 2
    visible = TreeRows.from_parents(start, [-1, 0, 0, 1, 2, 2]).visible if tree else None
    ours = row_ops.attend_rows(q, k, v, start, scale, visible)
    exact = _float64_attention(q, k, v, start, scale, visible)
    gemm_path = attend(q, k[:, : start + n], v[:, : start + n], scale=scale, causal=True, mask=visible)
    assert (ours.double() - exact).abs().max() <= max(2e-6, (gemm_path.double() - exact).abs().max())
    for i in range(n):  # each row alone, at its own position, sees exactly the keys it saw among the others
        alone = row_ops.attend_rows(q[i : i + 1], k, v, start + i, scale,
                                    None if visible is None else visible[i : i + 1, : start + i + 1])
        assert torch.equal(alone[0], ours[i])


def test_attend_requests_takes_the_row_kernel_for_decodes_and_the_gemm_path_for_long_chunks(monkeypatch) -> None:
    calls, original = [], row_ops.attend_rows
    monkeypatch.setattr(row_ops, "attend_rows", lambda *a, **k: calls.append(a[0].shape[0]) or original(*a, **k))
    k_cache, v_cache = torch.randn(2, KV, 200, DIM, generator=_gen()), torch.randn(2, KV, 200, DIM, generator=_gen(1))
    long = row_ops.ATTEND_MAX_ROWS + 1
    q = torch.randn(2 + long, HEADS, DIM, generator=_gen(2))
    out = attention_module.attend_requests(q, k_cache, v_cache, [1, 0], [10, 0], [2, long], [None, None], scale=0.1,
                                           kernel=row_ops)
    assert calls == [2]  # the decode-sized request only
    want = attend(q[2:], k_cache[0, :, :long], v_cache[0, :, :long], scale=0.1, causal=True)
    assert torch.equal(out[2:], want)

