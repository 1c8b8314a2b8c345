"""The few-row kernel in oneDNN's rounding order: bitwise equal to oneDNN's many-row rows, probed, with fallbacks."""
from __future__ import annotations

import platform

import numba
import pytest
import torch
from model_factories import random_linear

from specdec_cli.models import fast_linear
from specdec_cli.models.fast_linear import Linear, LinearGroup
from specdec_cli.models.row_gemv import BLOCK, MAX_ROWS, RowGemv

# SmolLM2-135M's shapes (q/k/v grouped, o, gate/up grouped, down, LM head), then ragged ones
SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152), (70, 100), (576, BLOCK + 1)]

pytestmark = pytest.mark.skipif(
    not fast_linear.onednn_available() or platform.machine() not in ("x86_64", "AMD64"),
    reason="the rounding order probed here is oneDNN's x86 fp32 GEMM",
)


def _linear(in_f: int, out_f: int, bias: bool = False) -> Linear:
    return random_linear(in_f, out_f, bias, seed=in_f + out_f)


@pytest.mark.parametrize(("in_f", "out_f"), SHAPES)
def test_few_rows_equal_many_row_rows_bit_for_bit(in_f: int, out_f: int) -> None:
    layer = _linear(in_f, out_f)
    many = MAX_ROWS + 3
    x = torch.randn(many, in_f) * torch.logspace(-3, 3, many)[:, None]  # rows of very different scales
    with torch.inference_mode():
        rows = layer(x)  # more rows than the kernel takes: oneDNN
        assert layer._packed._value._row is fast_linear._UNBUILT, "a many-row call built the row kernel's copy"
        kernel = layer._packed._value.row_kernel()
        assert kernel is not None, "no chain split reproduced oneDNN on this CPU: decode pads single rows"
        for size in range(1, MAX_ROWS + 1):
            pieces = torch.cat([layer(x[i : i + size]) for i in range(0, many, size)])
            assert torch.equal(pieces, rows), f"{size}-row calls round differently from {many}-row calls"


def test_a_group_with_biases_takes_the_kernel_and_stays_exact() -> None:
    q, k = _linear(64, 48, bias=True), _linear(64, 16, bias=True)
    group = LinearGroup(q, k)
    x = torch.randn(4, 64)
    with torch.inference_mode():
        many = torch.cat(group(x), dim=-1)
        ones = torch.cat([torch.cat(group(x[i : i + 1]), dim=-1) for i in range(4)])
        assert group._packed._value.row_kernel() is not None
    assert torch.equal(ones, many)


def test_the_probe_refuses_a_reference_it_cannot_reproduce() -> None:
    weight = torch.randn(BLOCK, 128)

    def off_by_an_ulp(rows: torch.Tensor) -> torch.Tensor:
        return torch.nextafter(rows @ weight.T, torch.tensor(float("inf")))

    assert RowGemv.probe(weight, None, off_by_an_ulp) is None


def test_without_the_kernel_a_single_row_is_padded_and_still_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast_linear, "row_gemv_module", lambda: None)  # as where numba cannot be imported
    layer = _linear(576, 192)
    x = torch.randn(3, 576)
    with torch.inference_mode():
        singles = torch.cat([layer(x[i : i + 1]) for i in range(3)])
        assert layer._packed._value.row_kernel() is None
        assert torch.equal(singles, layer(x))
        layer.row_invariant = False  # no kernel: a single row takes F.linear (MKL), close but not bitwise
        assert layer._packed.get(x[:1], row_invariant=False) is None
        torch.testing.assert_close(layer(x[:1]), singles[:1], rtol=0, atol=1e-5)


def test_the_kernel_follows_weight_updates() -> None:
    layer = _linear(64, 32)
    x = torch.randn(1, 64)
    with torch.inference_mode():
        before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)
    with torch.inference_mode():
        assert torch.equal(layer(x), layer(x.expand(2, -1))[:1])
        torch.testing.assert_close(layer(x), 2 * before, rtol=1e-6, atol=1e-6)


def test_switching_the_kernel_off_after_it_was_built_sends_rows_to_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = _linear(64, 32)
    x = torch.randn(1, 64)
    calls = []
    with torch.inference_mode():
        layer(x)  # builds and probes the row kernel; later calls skip the lookup
        assert layer._packed._value._row is not None
        onednn = layer._packed._value._onednn
        monkeypatch.setattr(layer._packed._value, "_onednn", lambda rows: calls.append(rows.shape[0]) or onednn(rows))
        with_kernel = layer(x)
        assert calls == []
        monkeypatch.setattr(fast_linear, "USE_ROW_KERNEL", False)  # what the benchmarks toggle mid-process
        assert torch.equal(layer(x), with_kernel) and calls == [1]


def test_numba_follows_torchs_thread_count_across_changes() -> None:
    from specdec_cli.models.row_gemv import gemm_rows, pack_blocks

    packed = pack_blocks(torch.randn(BLOCK, 64))
    before = torch.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS), 1):
            torch.set_num_threads(threads)
            gemm_rows(torch.randn(1, 64), packed, 64)
            assert numba.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


def test_warm_up_builds_every_packed_weight_and_row_kernel_and_leaves_no_trace() -> None:
    from model_factories import tiny_hf, to_ours

    model = to_ours(tiny_hf("llama", layers=2, seed=5)).requires_grad_(False)
    attention = model.layers[0].self_attn
    packed = [model.lm_head._packed, attention.o_proj._packed, attention.qkv._packed]  # alone, and grouped
    assert all(p._value is None for p in packed)
    model.warm_up()
    assert all(p._value is not None and p._value._row is not fast_linear._UNBUILT for p in packed)
    ids = torch.tensor([5, 7, 9])
    cache = model.new_cache(1, 8)
    with torch.inference_mode():
        logits = model(cache, [0], ids).logits
    fresh = to_ours(tiny_hf("llama", layers=2, seed=5)).requires_grad_(False)
    with torch.inference_mode():
        assert torch.equal(logits, fresh(fresh.new_cache(1, 8), [0], ids).logits)


def test_precompile_covers_every_row_count_and_weight_dtype() -> None:
    """`make install` runs ``precompile``: afterwards every call ``gemm_rows`` can make is already compiled, so no
    measured step pays numba's first-use compile (cached on disk: cheap when install already ran it)."""
    from specdec_cli.models import row_gemv

    row_gemv.precompile()
    compiled = {(sig[1].dtype.name, sig[4:]) for kernel in (row_gemv._gemm, row_gemv._gemm_two_groups)
                for sig in kernel.signatures}
    for dtype in ("float32", "int8"):
        for rows in range(1, row_gemv.MAX_ROWS + 1):
            tags = tuple(numba.typeof(tag) for tag in row_gemv._ROW_TAGS[rows])
            assert (dtype, tags) in compiled, (dtype, rows)


class _Features(dict):
    """What llvmlite.binding.get_host_cpu_features returns: a feature -> bool mapping with ``flatten``."""

    def flatten(self) -> str:
        return ",".join(("+" if on else "-") + name for name, on in self.items())


@pytest.mark.parametrize(
    ("host", "preset", "opt_out", "want"),
    [
        ({"avx512f": True, "fma": True}, None, None, "+avx512f,+fma,-prefer-256-bit"),
        ({"avx512f": False, "avx2": True}, None, None, None),  # AVX2 host: nothing to widen
        ({"avx512f": True}, "+avx2,+fma", None, "+avx2,+fma"),  # the user's NUMBA_CPU_FEATURES wins
        ({"avx512f": True}, None, "0", None),  # SPECDEC_WIDE_VECTORS=0 opts out
    ],
)
def test_use_wide_vectors_drops_llvms_256_bit_preference_on_avx512_only(monkeypatch, host, preset, opt_out, want):
    from specdec_cli import numba_setup

    monkeypatch.setattr(numba.config, "CPU_FEATURES", preset)
    monkeypatch.setattr(numba_setup.llvmlite.binding, "get_host_cpu_features", lambda: _Features(host))
    if opt_out is None:
        monkeypatch.delenv(numba_setup.OPT_OUT, raising=False)
    else:
        monkeypatch.setenv(numba_setup.OPT_OUT, opt_out)
    numba_setup.use_wide_vectors()
    assert numba.config.CPU_FEATURES == want
    assert numba_setup.wide_vectors() == (want is not None and want.endswith("-prefer-256-bit"))
