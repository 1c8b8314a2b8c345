"""Logits and hidden states equal HF transformers' on tiny random Llama / Qwen2 / Qwen3 models."""
from __future__ import annotations

import pytest
import torch

from specdec_cli.models import eagle3_default_layers

from model_factories import tiny_hf, to_ours

SEQ = 48


def _ids(n: int = SEQ, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(seed))


#: Hidden states (|x| up to ~15 here) agree to float32 rounding: HF's own float32 forward is ~1e-5 from its float64
#: one, ours (CPU row kernels: norm, attention) as close; they differ from each other by up to ~2e-5.
HIDDEN_ATOL = 4e-5


def _assert_close_logits(ours: torch.Tensor, ref: torch.Tensor) -> None:
    scale = ref.abs().max().item()
    assert scale > 1.0, "test model produces near-uniform logits; raise the init scale"
    assert (ours - ref).abs().max().item() <= 1e-5 * scale
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize(
    ("family", "tie", "rope"),
    [
        ("llama", False, "default"),
        ("llama", True, "default"),
        ("llama", False, "linear"),
        ("llama", False, "dynamic"),
        ("llama", False, "llama3"),
        ("llama", True, "yarn"),
        ("qwen2", False, "default"),
        ("qwen2", True, "yarn"),
        ("qwen3", True, "default"),
        ("qwen3", False, "linear"),
    ],
)
@torch.inference_mode()
def test_logits_match_hf(family: str, tie: bool, rope: str) -> None:
    hf = tiny_hf(family, tie=tie, rope=rope)
    model = to_ours(hf)
    assert model.arch.tie_word_embeddings == tie
    ids = _ids()
    ref = hf(ids[None]).logits[0]
    out = model(model.new_cache(1, 64), [0], ids).logits
    _assert_close_logits(out, ref)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@torch.inference_mode()
def test_hidden_layers_are_hf_hidden_states_shifted_by_one(family: str) -> None:
    hf = tiny_hf(family, layers=4)
    model = to_ours(hf)
    ids = _ids(20)
    ref = hf(ids[None], output_hidden_states=True).hidden_states
    out = model(model.new_cache(1, 32), [0], ids, hidden_layers=(0, 1, 2), final_hidden=True)
    for layer in (0, 1, 2):
        torch.testing.assert_close(out.hidden[layer], ref[layer + 1][0], rtol=0, atol=HIDDEN_ATOL)
    # HF's last entry is the post-final-norm hidden
    torch.testing.assert_close(out.final_hidden, ref[-1][0], rtol=0, atol=HIDDEN_ATOL)


@torch.inference_mode()
def test_eagle3_default_layers_are_hf_hidden_states_2_half_and_n_minus_3() -> None:
    num_layers = 8
    hf = tiny_hf("llama", layers=num_layers)
    model = to_ours(hf)
    layers = eagle3_default_layers(num_layers)
    assert layers == (1, num_layers // 2 - 1, num_layers - 4)
    ids = _ids(12)
    ref = hf(ids[None], output_hidden_states=True).hidden_states
    out = model(model.new_cache(1, 16), [0], ids, hidden_layers=layers)
    for layer, hf_index in zip(layers, (2, num_layers // 2, num_layers - 3)):
        torch.testing.assert_close(out.hidden[layer], ref[hf_index][0], rtol=0, atol=HIDDEN_ATOL)


@torch.inference_mode()
def test_long_context_beyond_one_key_chunk_matches_hf() -> None:
    """Prompts longer than attend's P @ V key chunk (256) and the rope table default length."""
    hf = tiny_hf("llama", max_position_embeddings=128)
    model = to_ours(hf)
    ids = _ids(300)
    ref = hf(ids[None]).logits[0]
    out = model(model.new_cache(1, 320), [0], ids).logits
    _assert_close_logits(out, ref)
