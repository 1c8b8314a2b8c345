"""Fixtures for the model runtime tests: tiny model pairs and the embedded model."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from model_factories import tiny_hf, to_ours
from transformers import PreTrainedModel

from specdec_cli.models import Transformer, load_model
from specdec_cli.models.loading import EMBEDDED_NAME, cached_gguf_dir, embedded_model_path


@pytest.fixture
def make_pair() -> Callable[..., tuple[PreTrainedModel, Transformer]]:
    """Factory: (HF model, our model) sharing weights; keywords as ``tiny_hf``."""

    def make(family: str = "llama", **kwargs: Any) -> tuple[PreTrainedModel, Transformer]:
        hf = tiny_hf(family, **kwargs)
        return hf, to_ours(hf)

    return make


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    """The converted embedded model directory (converted once, ~20-30 s; honours $SPECDEC_CACHE)."""
    return cached_gguf_dir(embedded_model_path(), name=EMBEDDED_NAME)


@pytest.fixture(scope="session")
def real_model(embedded_dir: Path) -> tuple[Transformer, Any]:
    """(model, tokenizer) for the embedded SmolLM2-135M-Instruct, float32 CPU."""
    return load_model(None)


@pytest.fixture(scope="session")
def real_hf(embedded_dir: Path) -> PreTrainedModel:
    """HF transformers' LlamaForCausalLM on the same converted weights."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(embedded_dir, dtype=torch.float32).eval()
