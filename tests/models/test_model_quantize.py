"""Weight-only int8 (model.dtype=int8): close to float32, row-invariant, refused where it cannot run."""
from __future__ import annotations

import pytest
import torch

from specdec_cli.models import ModelLoadError
from specdec_cli.models.quantize import Int8Linear, int8_unsupported_reason, quantize_model, quantize_weight

from model_factories import tiny_hf, to_ours


def test_quantized_weight_is_within_half_a_step_per_channel():
    weight = torch.randn(48, 32, generator=torch.Generator().manual_seed(0)) * torch.logspace(-2, 1, 48)[:, None]
    values, scale = quantize_weight(weight)
    assert values.dtype == torch.int8 and scale.shape == (48,)
    error = (values.float() * scale.float()[:, None] - weight).abs()
    assert (error <= scale.float()[:, None] * 0.5 + 1e-7).all()  # per channel: half a step, however small the row


def test_int8_model_tracks_float32_and_replaces_every_linear():
    model = to_ours(tiny_hf("qwen2", layers=2))  # q/k/v biases too
    ids = torch.randint(0, 128, (20,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        reference = model(model.new_cache(1, 32), [0], ids).logits
        quantize_model(model)
        logits = model(model.new_cache(1, 32), [0], ids).logits
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Linear"]
    assert linears == [] and isinstance(model.lm_head, Int8Linear)
    assert (logits.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9
    assert torch.allclose(logits, reference, atol=0.15 * reference.abs().max().item())


def test_int8_decode_equals_verify_bitwise():
    """Row invariance: K+1 tokens verified at once give the same logits as decoding them one by one,
    alone or next to another request (greedy speculative output == greedy autoregressive output)."""
    model = quantize_model(to_ours(tiny_hf("llama", layers=2)))
    prompt = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(2))
    new = torch.randint(0, 128, (6,), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        cache = model.new_cache(2, 32)
        model(cache, [0, 1], [prompt[0], prompt[1]])
        verified = model(cache, [0], new).logits
        cache.rewind(0, 9)
        decoded = [model(cache, [0, 1], [new[i : i + 1], prompt[1, :1]]).logits[0] for i in range(6)]
    assert torch.equal(verified, torch.stack(decoded))


def test_int8_refused_off_cpu():
    assert int8_unsupported_reason("cpu") is None
    assert "CPU only" in int8_unsupported_reason("cuda")
    model = to_ours(tiny_hf("llama", layers=1))
    model.embed_tokens.weight = torch.nn.Parameter(torch.empty(128, 64, device="meta"), requires_grad=False)
    with pytest.raises(ModelLoadError, match="model.dtype=int8: .*CPU only"):
        quantize_model(model)
