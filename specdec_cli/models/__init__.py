"""Target model runtime: Llama-family transformer, slot KV cache, weight loading.

Layer ids everywhere in this package mean "output of decoder layer i" = HF hidden_states[i + 1].
"""
from __future__ import annotations

from specdec_cli.models.arch import (
    ModelArch,
    UnsupportedArchitectureError,
    eagle3_default_layers,
    layer_ids_from_input_convention,
)
from specdec_cli.models.errors import CacheOverflowError, ModelError, ModelLoadError
from specdec_cli.models.kv_cache import KVCache
from specdec_cli.models.loading import embedded_model_path, load_model
from specdec_cli.models.transformer import ForwardOutput, Transformer

__all__ = [
    "CacheOverflowError",
    "ForwardOutput",
    "KVCache",
    "ModelArch",
    "ModelError",
    "ModelLoadError",
    "Transformer",
    "UnsupportedArchitectureError",
    "eagle3_default_layers",
    "embedded_model_path",
    "layer_ids_from_input_convention",
    "load_model",
]
