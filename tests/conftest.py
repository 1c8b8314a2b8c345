"""Shared fixtures: typed configs composed from conf/ (no files written, no models loaded)."""
from __future__ import annotations

from typing import Callable

import pytest

from specdec_cli.config.compose import compose_config
from specdec_cli.config.schema import RunConfig


@pytest.fixture
def make_config() -> Callable[..., RunConfig]:
    """``make_config("method=eagle3", "sampler=topk")`` -> the composed, typed RunConfig."""
    return lambda *overrides: compose_config(list(overrides))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A tiny random Llama checkpoint (2 layers, hidden 64) with the embedded model's tokenizer and chat
    template: ``model.path=<it>`` runs the real pipeline (API, server, CLI) in milliseconds per step."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec_cli.models.loading import EMBEDDED_NAME, cached_gguf_dir, embedded_model_path, load_tokenizer

    directory = tmp_path_factory.mktemp("tiny_model")
    tokenizer = load_tokenizer(cached_gguf_dir(embedded_model_path(), name=EMBEDDED_NAME))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         initializer_range=0.3, tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory
