"""MTP: a DeepSeek-V3-style multi-token-prediction module on the target's last hidden state.

Architecture (embedding first, as vLLM/SGLang load the published weights):

    x   = eh_proj(cat(enorm(emb(x_{p+1})), hnorm(h_p)))   [T, 2H] -> [T, H]
    o   = decoder layer(x)                                [T, H]   its own slot KV cache
    h'  = shared_head.norm(o)                             [T, H]   fed back as h for chain steps >= 2
    q   = target lm_head(h')                              [T, Vd]  the TARGET's head, shared, not stored

``h_p`` is the target's post-final-norm hidden at position p (``needs_final_hidden``). The same
module is reused for every chain step. An optional ``d2t`` restricts the shared head to a draft
vocabulary (rows ``d + d2t[d]`` of the target head), which makes a CPU draft step several times
cheaper; the token ids returned are target ids either way.

Checkpoint (a directory): ``config.json`` with the block's Llama fields, ``vocab_size``,
``num_hidden_layers`` = the target's layer count N and ``num_nextn_predict_layers: 1``; weights under
DeepSeek-V3's names ``model.layers.{N}.{enorm,hnorm,eh_proj,input_layernorm,self_attn.*,
post_attention_layernorm,mlp.*,shared_head.norm}``, plus ``d2t`` [Vd] when the vocabulary is reduced.
Copies of the shared tensors (``embed_tokens``, ``shared_head.head``) are ignored if present.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from specdec_cli.config.schema import MtpMethodConfig
from specdec_cli.drafters.base import DRAFTERS, Drafter, DrafterDeps
from specdec_cli.drafters.feature_head import AttentionFn, FeatureDrafter, FeatureHead, HeadLayer
from specdec_cli.drafters.learned import (
    Checkpoint, arch_config, check_d2t, load_head, save_checkpoint, shipped_checkpoint,
)
from specdec_cli.errors import ConfigError
from specdec_cli.models import ModelArch, Transformer
from specdec_cli.models.arch import UnsupportedArchitectureError
from specdec_cli.models.fast_linear import Linear, SharedLinear
from specdec_cli.models.layers import RMSNorm

ARCHITECTURE = "LlamaMTP"
REQUIRED_FIELDS = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "num_hidden_layers")
_LAYER_PREFIX = re.compile(r"^(?:model\.)?layers\.(\d+)\.")


class SharedHead(nn.Module):
    """DeepSeek's ``shared_head``: its own final norm; the head weight is the target's."""

    def __init__(self, arch: ModelArch, *, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype=dtype, device=device)


class MtpHead(HeadLayer, FeatureHead):
    """enorm/hnorm/eh_proj + one decoder layer + shared_head.norm; logits through ``lm_weight``.

    embed_weight [V, H] and lm_weight [Vd, H] are the target's (non-persistent buffers);
    d2t [Vd] int64 or None (full target vocabulary).
    """

    def __init__(self, arch: ModelArch, *, embed_weight: torch.Tensor, lm_weight: torch.Tensor,
                 d2t: Optional[torch.Tensor], dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        super().__init__(arch, arch.hidden_size, dtype=dtype, device=device)
        kw = dict(dtype=dtype, device=device)
        self.arch, self.hidden_layers, self.needs_final_hidden = arch, (), True
        self.draft_vocab_size = lm_weight.shape[0]
        self.enorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, **kw)
        self.hnorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, **kw)
        self.eh_proj = Linear(2 * arch.hidden_size, arch.hidden_size, **kw)
        self.shared_head = SharedHead(arch, **kw)
        self.register_buffer("d2t", None if d2t is None else d2t.to(device=device, dtype=torch.int64))
        self.register_buffer("embed_weight", embed_weight.detach().to(**kw), persistent=False)
        self.register_buffer("lm_weight", lm_weight.detach().to(**kw), persistent=False)
        self.lm_head = SharedLinear()  # row-invariant: a request's q does not depend on its batch

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return features  # the target's post-norm final hidden is the module's input as is

    def forward(self, hidden: torch.Tensor, token_ids: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        emb = self.enorm(F.embedding(token_ids, self.embed_weight))
        x = self.eh_proj(torch.cat([emb, self.hnorm(hidden)], dim=-1))
        return self.block(self.input_layernorm(x), x, functools.partial(attention, 0))

    def recycle(self, out: torch.Tensor) -> torch.Tensor:
        return self.shared_head.norm(out)  # post-norm, like the target hidden of step 1

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.shared_head.norm(out), self.lm_weight)


def shared_head_rows(target: Transformer, d2t: Optional[torch.Tensor]) -> torch.Tensor:
    """The target LM head [V, H], or its draft-vocabulary rows [Vd, H] (target ids d + d2t[d])."""
    weight = target.lm_head.weight
    if d2t is None:
        return weight
    return weight[torch.arange(d2t.numel(), device=weight.device) + d2t.to(weight.device)]


def load_mtp(directory: str | Path, target: Transformer, *, dtype: torch.dtype = torch.float32,
             device: torch.device | str = "cpu") -> MtpHead:
    """An MTP module for ``target`` from a checkpoint directory; ConfigError naming file/field/tensor."""
    ckpt = Checkpoint(directory)
    for key in REQUIRED_FIELDS:
        ckpt.field(key)
    try:
        arch = ModelArch.from_hf_config({**ckpt.config, "num_hidden_layers": 1, "architectures": None})
    except UnsupportedArchitectureError as err:
        raise ConfigError([f"{ckpt.config_file}: {err}"]) from None
    tarch = target.arch
    if (arch.hidden_size, arch.vocab_size) != (tarch.hidden_size, tarch.vocab_size):
        raise ConfigError([f"{ckpt.config_file}: hidden_size={arch.hidden_size}, vocab_size={arch.vocab_size} "
                           f"but the target has {tarch.hidden_size}, {tarch.vocab_size} (MTP shares its "
                           "embedding and LM head)"])
    layers = sorted({int(m.group(1)) for name in ckpt.tensors if (m := _LAYER_PREFIX.match(name))})
    num_mtp = ckpt.field("num_nextn_predict_layers", 1)
    if len(layers) > 1 or num_mtp != 1:
        raise ConfigError([f"{ckpt.directory}: {max(len(layers), num_mtp)} MTP layers (num_nextn_predict_layers="
                           f"{num_mtp}, tensors under layers {layers}); specdec loads exactly one MTP module and "
                           "will not merge several onto one set of weights"])
    ckpt.rename(lambda name: _LAYER_PREFIX.sub("", name))
    if "fc.weight" in ckpt.tensors:
        raise ConfigError([f"{ckpt.directory}: an EAGLE-3 head, not an MTP module (use method=eagle3)"])
    d2t = ckpt.tensors.get("d2t")
    if d2t is not None:
        check_d2t(d2t, tarch.vocab_size, ckpt.sources["d2t"])
    head = MtpHead(arch, embed_weight=target.embed_tokens.weight, lm_weight=shared_head_rows(target, d2t),
                   d2t=d2t, dtype=dtype, device=device)
    ckpt.load_into(head)
    return head.eval()


def save_mtp(head: MtpHead, directory: str | Path, *, target_num_layers: int) -> Path:
    """Write ``head`` under DeepSeek-V3's MTP names (the module is layer ``target_num_layers``)."""
    config = {**arch_config(head.arch), "architectures": [ARCHITECTURE], "num_hidden_layers": target_num_layers,
              "num_nextn_predict_layers": 1, "draft_vocab_size": head.draft_vocab_size}
    prefix = f"model.layers.{target_num_layers}."
    tensors = {name if name == "d2t" else prefix + name: t for name, t in head.state_dict().items()}
    return save_checkpoint(directory, config, tensors)


@DRAFTERS.register("mtp")
def build_mtp(cfg: MtpMethodConfig, deps: DrafterDeps) -> Drafter:
    head = load_head(load_mtp, cfg.checkpoint or shipped_checkpoint("mtp", "checkpoint"), cfg.head_dtype, deps)
    return FeatureDrafter(head, deps.target, num_slots=deps.num_slots, max_seq_len=deps.max_seq_len,
                          policy=cfg.draft_policy)
