"""Tiny randomly initialised HF models (built in-process) and their twins in our runtime."""
from __future__ import annotations

from typing import Any

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from specdec_cli.models import ModelArch, Transformer

FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}

ROPE_VARIANTS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
}


def tiny_hf(
    family: str = "llama", *, tie: bool = False, rope: str = "default", layers: int = 2, seed: int = 0, **overrides: Any
) -> PreTrainedModel:
    """A tiny randomly initialised HF causal LM (vocab 128, hidden 64, 4 q heads / 2 kv heads).

    Weights are redrawn with a larger scale than HF's init so logits are far from uniform.
    """
    config_cls, model_cls = FAMILIES[family]
    fields: dict[str, Any] = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if ROPE_VARIANTS[rope] is not None:
        fields["rope_scaling"] = dict(ROPE_VARIANTS[rope])
    fields.update(overrides)
    config = config_cls(**fields)
    config.architectures = [model_cls.__name__]
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.15)
    return model


def to_ours(hf: PreTrainedModel) -> Transformer:
    """Our Transformer with the HF model's weights."""
    model = Transformer(ModelArch.from_hf_config(hf.config))
    model.load_state_dict({k.removeprefix("model."): v for k, v in hf.state_dict().items()})
    return model.requires_grad_(False).eval()


def random_linear(in_features: int, out_features: int, bias: bool = False, seed: int = 0):
    """A frozen ``fast_linear.Linear`` with N(0, 1/in_features) weights (and N(0, 1) biases)."""
    from specdec_cli.models.fast_linear import Linear

    torch.manual_seed(seed)
    layer = Linear(in_features, out_features, bias)
    with torch.no_grad():
        layer.weight.normal_(0, in_features**-0.5)
        if layer.bias is not None:
            layer.bias.normal_()
    return layer.requires_grad_(False)
