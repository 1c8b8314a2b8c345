"""Fixtures for the model runtime tests: the embedded model, converted once per cache ($SPECDEC_CACHE)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedModel

from specdec_cli.models import Transformer, load_model
from specdec_cli.models.loading import EMBEDDED_NAME, cached_gguf_dir, embedded_model_path


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    """The converted embedded model directory (the first conversion takes ~20-30 s)."""
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
