"""Toy models built in-process: tests, self-checks and examples use them, never a download.

``toy_model`` is a randomly initialised Llama-family transformer with a small vocabulary;
``sharpness`` scales the LM head so that its next-token distributions are peaked enough to
be interesting (greedy paths with structure, sampled laws that are neither uniform nor
one-hot).
"""
from __future__ import annotations

import torch

from specdec_cli.models import ModelArch, Transformer


def toy_arch(*, vocab_size: int = 32, num_layers: int = 2, hidden_size: int = 32, num_heads: int = 4,
             num_kv_heads: int = 2, qk_norm: bool = False) -> ModelArch:
    return ModelArch(
        vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=hidden_size // num_heads, intermediate_size=2 * hidden_size,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, qk_norm=qk_norm,
        max_position_embeddings=4096, eos_token_ids=(),
    )


@torch.no_grad()
def toy_model(seed: int = 0, *, sharpness: float = 3.0, **arch_kwargs) -> Transformer:
    """A seeded random ``Transformer`` (float32, CPU) for tests."""
    arch = toy_arch(**arch_kwargs)
    model = Transformer(arch)
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight") or "layernorm" in name:
            param.fill_(1.0)
        else:
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    model.lm_head.weight.mul_(sharpness)
    return model.eval()


def sampling_params_tensors(temperature: float, top_k: int, top_p: float, rows: int):
    return (torch.full((rows,), temperature), torch.full((rows,), top_k, dtype=torch.int64),
            torch.full((rows,), top_p))


@torch.inference_mode()
def exact_sequence_law(model: Transformer, prompt: list[int], num_tokens: int, *, temperature: float,
                       top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The target-only law of the first ``num_tokens`` generated tokens: [V] * num_tokens, float64.

    Enumerates every prefix (V ** (num_tokens - 1) forwards in one ragged batch per depth),
    applying the same filters as the engine (``probs_from_logits``).
    """
    from specdec_cli.sampling import probs_from_logits

    vocab = model.arch.vocab_size
    law = torch.ones(1, dtype=torch.float64)
    prefixes = torch.zeros(1, 0, dtype=torch.int64)
    for _ in range(num_tokens):
        rows = prefixes.shape[0]
        cache = model.new_cache(rows, len(prompt) + num_tokens)
        feeds = [torch.cat([torch.tensor(prompt), prefix]) for prefix in prefixes]
        logits = model(cache, list(range(rows)), feeds, logits_for="last").logits
        probs = probs_from_logits(logits, *sampling_params_tensors(temperature, top_k, top_p, rows)).double()
        law = (law[:, None] * probs).reshape(-1)
        prefixes = torch.cat([prefixes.repeat_interleave(vocab, 0), torch.arange(vocab).repeat(rows)[:, None]], 1)
    return law.view(*([vocab] * num_tokens))
