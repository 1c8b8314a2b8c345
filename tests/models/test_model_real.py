"""The embedded SmolLM2-135M-Instruct: HF parity, a sensible chat answer, verify == decode."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import PreTrainedModel

from specdec_cli.models import Transformer

pytestmark = pytest.mark.realmodel

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
]


def _greedy(model: Transformer, prompt_ids: list[int], max_new: int, eos: int) -> list[int]:
    cache = model.new_cache(1, len(prompt_ids) + max_new)
    logits = model(cache, [0], torch.tensor(prompt_ids), logits_for="last").logits
    out: list[int] = []
    while len(out) < max_new:
        token = int(logits[0].argmax())
        if token == eos:
            break
        out.append(token)
        logits = model(cache, [0], torch.tensor([token])).logits
    return out


def test_embedded_arch(real_model: tuple[Transformer, Any]) -> None:
    model, tokenizer = real_model
    arch = model.arch
    assert (arch.num_layers, arch.hidden_size, arch.vocab_size, arch.num_heads, arch.num_kv_heads) == (
        30, 576, 49152, 9, 3,
    )
    assert arch.tie_word_embeddings and model.lm_head.weight is model.embed_tokens.weight
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"


@torch.inference_mode()
def test_logits_match_hf(real_model: tuple[Transformer, Any], real_hf: PreTrainedModel) -> None:
    model, tokenizer = real_model
    for prompt in PROMPTS:
        ids = torch.tensor(tokenizer(prompt)["input_ids"])
        ref = real_hf(ids[None]).logits[0]
        cache = model.new_cache(1, 64)
        full = model(cache, [0], ids).logits
        scale = ref.abs().max().item()
        assert (full - ref).abs().max().item() <= 2e-5 * scale, prompt
        assert torch.equal(full.argmax(-1), ref.argmax(-1)), prompt
        # prefix then token-by-token decode reproduces the same logits
        cache.rewind(0, 0)
        steps = [model(cache, [0], ids[:3]).logits]
        steps += [model(cache, [0], ids[i : i + 1]).logits for i in range(3, len(ids))]
        torch.testing.assert_close(torch.cat(steps), full, rtol=0, atol=1e-4)


@torch.inference_mode()
def test_chat_answer_is_sensible(real_model: tuple[Transformer, Any]) -> None:
    model, tokenizer = real_model
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(prompt_ids, list):  # transformers 5 returns a BatchEncoding
        prompt_ids = prompt_ids["input_ids"]
    text = tokenizer.decode(_greedy(model, list(prompt_ids), 24, tokenizer.eos_token_id))
    assert "Paris" in text, text


@torch.inference_mode()
def test_verify_argmax_equals_decode_argmax(real_model: tuple[Transformer, Any]) -> None:
    model, tokenizer = real_model
    ids = torch.tensor(tokenizer(PROMPTS[2])["input_ids"])
    drafts = torch.tensor(tokenizer(" there lived an old fisherman")["input_ids"])
    cache = model.new_cache(1, 64)
    model(cache, [0], ids)
    verify = model(cache, [0], drafts).logits
    cache.rewind(0, len(ids))
    decode = torch.cat([model(cache, [0], drafts[i : i + 1]).logits for i in range(len(drafts))])
    torch.testing.assert_close(verify, decode, rtol=0, atol=1e-4)
    assert torch.equal(verify.argmax(-1), decode.argmax(-1))
