"""Differentiable training forwards of the learned drafters, on the inference modules' own weights.

Only the attention path differs from inference (which writes a slot KV cache and rotates with
``out=`` kernels that autograd cannot follow): ``ChainAttention`` attends over whole sequences.

Training-time test (EAGLE-3, reference/methods.md §3.4): a head is unrolled for ``steps`` chain
steps over every row of a batch at once. At step j the row anchored at position p sits at RoPE
position p + j, reads the ground-truth token x_{p+1+j} and the head's own hidden from step j-1,
and attends to the step-0 keys of rows <= p (computed from real target features) plus its own
row's keys from steps 1..j: exactly the keys a drafting chain anchored at p has in its cache.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from specdec_cli.drafters.feature_head import FeatureHead
from specdec_cli.models import Transformer
from specdec_cli.models.layers import Attention
from specdec_cli.models.rope import RotaryTables


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE (rotate-half layout) on x [B, L, heads, D] with cos/sin [L, 1, D/2]; differentiable."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@functools.lru_cache(maxsize=32)
def chain_mask(length: int, steps: int, device: torch.device) -> torch.Tensor:
    """[L, steps*L] bool (True = may attend): causal over the step-0 keys, own row over later steps."""
    eye = torch.eye(length, dtype=torch.bool, device=device)
    return torch.cat([torch.ones_like(eye).tril_()] + [eye] * (steps - 1), dim=1)


class ChainAttention:
    """The attention of an unrolled head: call it once per layer and chain step (see the module doc).

    ``__call__(layer, attn, x [B, L, A]) -> [B, L, H]``; each layer keeps the keys/values of its earlier steps.
    """

    def __init__(self, rope: RotaryTables) -> None:
        self.rope = rope
        self.keys: dict[int, list[torch.Tensor]] = {}
        self.values: dict[int, list[torch.Tensor]] = {}

    def __call__(self, layer: int, attn: Attention, x: torch.Tensor) -> torch.Tensor:
        batch, length = x.shape[:2]
        keys, values = self.keys.setdefault(layer, []), self.values.setdefault(layer, [])
        step = len(keys)
        self.rope.ensure(length + step)
        positions = torch.arange(step, step + length, device=x.device)
        cos, sin = self.rope.cos[positions].unsqueeze(1), self.rope.sin[positions].unsqueeze(1)
        q = attn.q_proj(x).view(batch, length, attn.num_heads, attn.head_dim)
        k = attn.k_proj(x).view(batch, length, attn.num_kv_heads, attn.head_dim)
        v = attn.v_proj(x).view(batch, length, attn.num_kv_heads, attn.head_dim)
        if attn.q_norm is not None and attn.k_norm is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = rotate(q, cos, sin).transpose(1, 2), rotate(k, cos, sin).transpose(1, 2)
        keys.append(k)
        values.append(v.transpose(1, 2))
        out = F.scaled_dot_product_attention(
            q, torch.cat(keys, dim=2), torch.cat(values, dim=2),
            attn_mask=chain_mask(length, step + 1, x.device), scale=attn.scale, enable_gqa=True,
        )
        return attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


def unroll_head(head: FeatureHead, rope: RotaryTables, features: torch.Tensor, tokens: torch.Tensor,
                steps: int) -> list[torch.Tensor]:
    """Head outputs of ``steps`` chain steps over every row: features [B, L, F] (the target's, row p =
    position p), tokens [B, >= L + steps] (the sequence, zero-padded) -> [B, L, H] per step."""
    length = features.shape[1]
    attention = ChainAttention(rope)
    hidden, outs = head.fuse(features), []
    for step in range(steps):
        out = head(hidden, tokens[:, 1 + step : 1 + step + length], attention)
        outs.append(out)
        hidden = head.recycle(out)
    return outs


def model_hidden(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """A draft model's post-norm hidden states [B, L, H] for tokens [B, L] (causal, positions 0..L-1)."""
    x = model.embed_tokens(tokens)
    attention = ChainAttention(model.rope)
    for i, layer in enumerate(model.layers):
        h = x + attention(i, layer.self_attn, layer.input_layernorm(x))
        x = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.norm(x)
