"""DFlash: the draft network of a block drafter conditioned on target features, and its checkpoint files.

Architecture (z-lab ``dflash/model.py``, the published layout, so public drafts load):

    c    = hidden_norm(fc(cat(h_l for l in target_layers)))   [T, n*Ht] -> [T, H]  one row per committed token
    x    = target_embed([x_s, m, ..., m])                      [B, H]   the block: anchor x_s + B-1 mask tokens
    per draft layer (a Qwen3 decoder layer):
      K, V = k_norm(k_proj(c)), v_proj(c) at positions 0..s-1   (context: cached per slot)
             ++ k_norm(k_proj(norm(x))), v_proj(norm(x)) at s..s+B-1
      x    = x + o_proj(attn(q_norm(q_proj(norm(x))), K, V))   non-causal: each block query sees the whole
                                                                context and the whole block
      x    = x + mlp(post_attention_layernorm(x))
    logits = target_lm_head(norm(x))                            [B, V]   block position j predicts x_{s+j}

The anchor is the newest committed token, whose target features are not known yet: the context is
the committed tokens strictly before it. ``target_layers`` use the output-of-layer-i convention
(HF ``hidden_states[i + 1]``), as the published ``target_layer_ids``. Embedding and LM head are the
target's (not stored). The drafter that runs it is ``dflash_drafter.DFlashDrafter``.

Checkpoint (a directory): ``config.json`` with the draft layers' Qwen3/Llama fields (``hidden_size``,
``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
``intermediate_size``, ``rms_norm_eps``, ``rope_theta``, ``vocab_size`` = the target's), optional
``target_hidden_size``, and ``dflash_config: {target_layer_ids, mask_token_id, block_size}`` (each
also accepted at the top level; ``block_size`` defaults to 16); weights (safetensors):
``fc.weight`` [H, n*Ht], ``hidden_norm.weight``, ``norm.weight``, ``layers.{i}.input_layernorm.weight``,
``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.self_attn.{q,k}_norm.weight`` (Qwen3),
``layers.{i}.post_attention_layernorm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``
(a ``model.`` prefix is accepted). Sliding-window or causal drafts are refused.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from specdec_cli.drafters.learned import Checkpoint, arch_config, save_checkpoint
from specdec_cli.errors import ConfigError
from specdec_cli.models import ModelArch, Transformer
from specdec_cli.models.arch import UnsupportedArchitectureError
from specdec_cli.models.fast_linear import Linear, SharedLinear
from specdec_cli.models.layers import Attention, DecoderLayer, RMSNorm
from specdec_cli.models.rope import RotaryTables

ARCHITECTURE = "DFlashDraftModel"
REQUIRED_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
#: published options this implementation does not have (DFlash-2, gpt-oss style drafts)
UNSUPPORTED_OPTIONS = ("input_embedding_scale", "output_multiplier", "final_logit_softcapping", "selector_rank",
                       "conv_kernel_size", "use_swa", "causal")


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE (rotate-half layout) on x [M, heads, D] with cos/sin [M, 1, D/2]; differentiable."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def keys_values(attn: Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, H] -> rotated keys (k_norm first, if any) and values, each [M, KV, D]; differentiable."""
    k = attn.k_proj(x).view(x.shape[0], attn.num_kv_heads, attn.head_dim)
    v = attn.v_proj(x).view(x.shape[0], attn.num_kv_heads, attn.head_dim)
    return rotate(attn.k_norm(k) if attn.k_norm is not None else k, cos, sin), v


def queries(attn: Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [M, H] -> rotated queries (q_norm first, if any) [M, Hq, D]; differentiable."""
    q = attn.q_proj(x).view(x.shape[0], attn.num_heads, attn.head_dim)
    return rotate(attn.q_norm(q) if attn.q_norm is not None else q, cos, sin)


def masked_layer(layer: DecoderLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                 context: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """A decoder layer over S rows of N tokens with an explicit attention mask; differentiable.

    x: [S, N, H]; cos/sin: [S*N, 1, D/2] (each token's position); mask: [S, N, T + N] bool, True = may
    attend, over the ``context`` keys/values ([S, KV, T, D] each; T = 0 when None) then the N tokens.
    """
    batch, num = x.shape[:2]
    attn = layer.self_attn
    h = layer.input_layernorm(x).reshape(batch * num, -1)
    q = queries(attn, h, cos, sin).view(batch, num, attn.num_heads, -1).transpose(1, 2)
    k, v = (t.view(batch, num, attn.num_kv_heads, -1).transpose(1, 2) for t in keys_values(attn, h, cos, sin))
    if context is not None:
        k, v = torch.cat([context[0], k], dim=2), torch.cat([context[1], v], dim=2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=attn.scale, enable_gqa=True)
    x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, num, -1))
    return x + layer.mlp(layer.post_attention_layernorm(x))


class DFlashDraft(nn.Module):
    """fc + hidden_norm + draft layers + norm (see the module doc); the target's embedding and LM head
    are non-persistent buffers (``embed_weight`` [V, H], ``head_weight`` [V, H]), shared and frozen."""

    def __init__(self, arch: ModelArch, *, target_layers: Sequence[int], target_hidden_size: int, block_size: int,
                 mask_token_id: int, embed_weight: torch.Tensor, head_weight: torch.Tensor,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.arch, self.target_layers = arch, tuple(target_layers)
        self.block_size, self.mask_token_id = block_size, mask_token_id
        self.fc = Linear(len(self.target_layers) * target_hidden_size, arch.hidden_size, **kw)
        self.hidden_norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, **kw)
        self.layers = nn.ModuleList(DecoderLayer(arch, **kw) for _ in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, **kw)
        self.rope = RotaryTables(arch, **kw)
        self.register_buffer("embed_weight", embed_weight.detach().to(**kw), persistent=False)
        self.register_buffer("head_weight", head_weight.detach().to(**kw), persistent=False)
        self.head = SharedLinear()  # row-invariant: a request's q does not depend on its batch

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [..., n*Ht] (``target_layers`` outputs, concatenated) -> context rows [..., H]."""
        return self.hidden_norm(self.fc(features))

    def context_kv(self, context: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Context rows [M, H] at ``positions`` [M] -> per draft layer (keys, values), each [M, KV, D]."""
        self.rope.ensure(int(positions.max()) + 1)
        cos, sin = self.rope.lookup(positions)
        return [keys_values(layer.self_attn, context, cos, sin) for layer in self.layers]

    def decode(self, block_ids: torch.Tensor, positions: torch.Tensor,
               context: Sequence[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> torch.Tensor:
        """One non-causal forward over blocks; returns the normed hidden [S, N, H].

        block_ids / positions: [S, N] (anchor then masks, per block); context: per layer (keys, values)
        [S, KV, T, D]; mask: [S, N, T + N] bool, True = may attend (context keys first, then the block keys).
        """
        self.rope.ensure(int(positions.max()) + 1)
        cos, sin = self.rope.lookup(positions.reshape(-1))
        x = F.embedding(block_ids, self.embed_weight)
        for layer, layer_context in zip(self.layers, context):
            x = masked_layer(layer, x, cos, sin, mask, layer_context)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Normed hidden [..., H] -> logits [..., V] through the target's LM head."""
        return self.head(hidden, self.head_weight)

    def forward(self, features: torch.Tensor, block_ids: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """Training form: context from features [S, T, F] at positions 0..T-1, blocks as in ``decode``;
        returns the normed hidden [S, N, H]."""
        batch, length = features.shape[:2]
        ctx_pos = torch.arange(length, device=features.device).repeat(batch)
        kv = self.context_kv(self.fuse(features).reshape(batch * length, -1), ctx_pos)
        context = [tuple(t.view(batch, length, *t.shape[1:]).transpose(1, 2) for t in pair) for pair in kv]
        return self.decode(block_ids, positions, context, mask)


def load_dflash(directory: str | Path, target: Transformer, *, target_layers: Optional[Sequence[int]] = None,
                dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> DFlashDraft:
    """A DFlash draft for ``target`` from a checkpoint directory; ConfigError naming the file/field/tensor."""
    ckpt = Checkpoint(directory)
    nested: dict[str, Any] = ckpt.field("dflash_config", None) or {}

    def value(key: str, default: Any = ...) -> Any:
        return nested[key] if key in nested else ckpt.field(key, default)

    for key in REQUIRED_FIELDS:
        ckpt.field(key)
    source = ckpt.config_file
    try:
        arch = ModelArch.from_hf_config({k: v for k, v in ckpt.config.items() if k != "architectures"})
    except UnsupportedArchitectureError as err:
        raise ConfigError([f"{source}: {err}"]) from None
    tarch = target.arch
    target_hidden = value("target_hidden_size", None) or arch.hidden_size
    layers = tuple(target_layers) if target_layers else tuple(value("target_layer_ids"))
    mask, block_size = value("mask_token_id"), int(value("block_size", 16))
    problems = [f"{option} is not supported" for option in UNSUPPORTED_OPTIONS if value(option, None)]
    if arch.sliding_window is not None:
        problems.append("sliding-window draft layers are not supported")
    if (arch.vocab_size, arch.hidden_size, target_hidden) != (tarch.vocab_size, tarch.hidden_size, tarch.hidden_size):
        problems.append(f"vocab_size={arch.vocab_size}, hidden_size={arch.hidden_size}, target_hidden_size="
                        f"{target_hidden} must equal the target's ({tarch.vocab_size}, {tarch.hidden_size}): the draft "
                        "shares the target's embedding and LM head")
    if not layers or not all(0 <= layer < tarch.num_layers for layer in layers):
        problems.append(f"target_layer_ids={list(layers)} must be output-of-layer ids in 0..{tarch.num_layers - 1}")
    if not isinstance(mask, int) or not 0 <= mask < tarch.vocab_size:
        problems.append(f"mask_token_id={mask!r} must be a token id in [0, {tarch.vocab_size})")
    if block_size < 2:
        problems.append(f"block_size={block_size} must be >= 2 (an anchor and at least one mask)")
    if problems:
        raise ConfigError([f"{source}: {p}" for p in problems])
    draft = DFlashDraft(arch, target_layers=layers, target_hidden_size=target_hidden, block_size=block_size,
                        mask_token_id=mask, embed_weight=target.embed_tokens.weight,
                        head_weight=target.lm_head.weight, dtype=dtype, device=device)
    ckpt.tensors = {name.removeprefix("model."): t for name, t in ckpt.tensors.items()}
    ckpt.sources = {name.removeprefix("model."): f for name, f in ckpt.sources.items()}
    ckpt.load_into(draft, {})
    return draft.eval()


def save_dflash(draft: DFlashDraft, directory: str | Path, *, dtype: Optional[torch.dtype] = None) -> Path:
    """Write ``draft`` in the published layout (see the module doc), its tensors cast to ``dtype`` if given."""
    options = {"target_layer_ids": list(draft.target_layers), "mask_token_id": draft.mask_token_id,
               "block_size": draft.block_size}
    config = {**arch_config(draft.arch), "architectures": [ARCHITECTURE], "tie_word_embeddings": False,
              "target_hidden_size": draft.fc.in_features // len(draft.target_layers),
              "block_size": draft.block_size, "dflash_config": options}
    tensors = {name: t.to(dtype) if dtype is not None else t for name, t in draft.state_dict().items()}
    return save_checkpoint(directory, config, tensors)
