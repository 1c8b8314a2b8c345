"""ModelArch.from_hf_config: dicts and config objects, per-family flags, clear refusals."""
from __future__ import annotations

import pytest
from model_factories import tiny_hf

from specdec_cli.models import (
    ModelArch,
    ModelLoadError,
    UnsupportedArchitectureError,
    eagle3_default_layers,
    layer_ids_from_input_convention,
)

LLAMA_DICT = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "max_position_embeddings": 131072,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
}


def test_llama3_dict() -> None:
    arch = ModelArch.from_hf_config(LLAMA_DICT)
    assert (arch.num_layers, arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.num_groups) == (32, 32, 8, 128, 4)
    assert arch.rope_theta == 500000.0 and arch.rope_scaling["rope_type"] == "llama3"
    assert arch.eos_token_ids == (128001, 128008, 128009)
    assert not arch.tie_word_embeddings and not arch.qk_norm and not arch.attention_bias


@pytest.mark.parametrize(
    ("family", "qk_norm", "qkv_bias", "o_bias"),
    [("llama", False, False, False), ("qwen2", False, True, False), ("qwen3", True, False, False)],
)
def test_family_flags_and_config_object_equals_dict(family: str, qk_norm: bool, qkv_bias: bool, o_bias: bool) -> None:
    config = tiny_hf(family, layers=1).config
    arch = ModelArch.from_hf_config(config)
    assert (arch.qk_norm, arch.attention_bias, arch.o_proj_bias) == (qk_norm, qkv_bias, o_bias)
    assert arch.sliding_window is None and arch.rope_scaling is None
    assert ModelArch.from_hf_config(config.to_dict()) == arch


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gemma3_text"}, "model_type='gemma3_text' is not supported"),
        ({"architectures": ["LlamaForSequenceClassification"]}, "is not a causal LM"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        (
            {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}},
            "rope_type='longrope'",
        ),
    ],
)
def test_unsupported_configs_are_refused_clearly(change: dict, message: str) -> None:
    with pytest.raises(UnsupportedArchitectureError, match=message) as err:
        ModelArch.from_hf_config({**LLAMA_DICT, **change})
    assert isinstance(err.value, ModelLoadError)


def test_layer_id_conventions() -> None:
    assert layer_ids_from_input_convention((2, 15, 29)) == (1, 14, 28)
    assert eagle3_default_layers(30) == (1, 14, 26)  # SmolLM2: HF hidden_states[2], [15], [27]
    assert eagle3_default_layers(32) == (1, 15, 28)  # Llama-3.1-8B: hidden_states[2], [16], [29]
    with pytest.raises(ValueError):
        layer_ids_from_input_convention((0,))
