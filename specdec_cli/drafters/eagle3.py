"""EAGLE-3: a draft head (one layer, or a few) on fused low/mid/high target features, with a reduced vocabulary.

Architecture (the published layout, so public Llama-family heads load):

    g    = cat(h_low, h_mid, h_high)              [T, 3*Ht]  target layer outputs (default layers
                                                             1, N/2-1, N-4 = HF hidden_states[2, N/2, N-3])
    h    = fc(g)                                  [T, H]     (chain steps >= 2: the head's own ``o``)
    a    = cat(input_layernorm(emb(x_{p+1})), hidden_norm(h))   [T, 2H]   q/k/v read 2H
    o    = midlayer(a, residual=h)                [T, H]     attention over the head's slot cache, SwiGLU MLP
    o    = layers[i](o)   i = 1 .. n-1            [T, H]     optional plain Llama decoder layers (n = num_hidden_layers)
    q    = lm_head(norm(o))                       [T, Vd]    draft vocabulary; target id = d + d2t[d]

Checkpoint (a directory): ``config.json`` with the Llama fields of the head (``hidden_size``,
``num_attention_heads``, ``intermediate_size``, ...), ``vocab_size`` (target), ``draft_vocab_size``,
optional ``target_hidden_size`` and ``eagle_aux_hidden_state_layer_ids`` (vLLM's input-to-layer ids;
``method.target_layers`` overrides them in this package's output-of-layer ids), optional
``norm_before_residual`` (vLLM); weights (safetensors or ``pytorch_model.bin``): ``fc.weight``,
``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``,
``norm.weight``, ``lm_head.weight``, ``d2t`` [Vd] int64, ``t2d`` [V] bool, optionally
``embed_tokens.weight`` (else the target's embedding is shared); with ``num_hidden_layers`` n > 1, the
plain layers' ``layers.{1..n-1}.{input_layernorm,self_attn.*,post_attention_layernorm,mlp.*}``. A ``model.``
prefix and vLLM's ``layers.0.`` for ``midlayer.`` are accepted.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from specdec_cli.config.schema import Eagle3MethodConfig
from specdec_cli.drafters.base import DRAFTERS, Drafter, DrafterDeps
from specdec_cli.drafters.eagle3_tree import TreeFeatureDrafter
from specdec_cli.drafters.feature_head import AttentionFn, FeatureDrafter, FeatureHead, HeadLayer
from specdec_cli.drafters.learned import (
    Checkpoint, arch_config, check_d2t, load_head, save_checkpoint, shipped_checkpoint,
)
from specdec_cli.errors import ConfigError
from specdec_cli.models import ModelArch, Transformer, eagle3_default_layers, layer_ids_from_input_convention
from specdec_cli.models.arch import UnsupportedArchitectureError
from specdec_cli.models.fast_linear import Linear
from specdec_cli.models.layers import RMSNorm

ARCHITECTURE = "LlamaForCausalLMEagle3"
REQUIRED_FIELDS = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
MAX_LAYERS = 8  # num_hidden_layers of a head this package loads or trains (train: head_layers)


class Eagle3Layer(HeadLayer):
    """The midlayer: attention over [input_layernorm(emb) ; hidden_norm(h)] (2H wide), residual h
    (``norm_before_residual``: residual hidden_norm(h), as some vLLM-trained heads)."""

    def __init__(self, arch: ModelArch, *, norm_before_residual: bool, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__(arch, 2 * arch.hidden_size, dtype=dtype, device=device)
        self.hidden_norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype=dtype, device=device)
        self.norm_before_residual = norm_before_residual


class Eagle3Head(FeatureHead):
    """fc + midlayer (+ ``num_layers - 1`` plain layers) + norm + lm_head over a draft vocabulary of
    ``d2t.numel()`` tokens (see the module doc).

    arch: the head's Llama shapes (``vocab_size`` = the target's); embed_weight [V, H] shared, frozen.
    """

    def __init__(self, arch: ModelArch, *, target_hidden_size: int, hidden_layers: Sequence[int],
                 draft_vocab_size: int, embed_weight: torch.Tensor, norm_before_residual: bool = False,
                 num_layers: int = 1, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        hidden = arch.hidden_size
        self.arch, self.hidden_layers, self.needs_final_hidden = arch, tuple(hidden_layers), False
        self.draft_vocab_size = draft_vocab_size
        self.fc = Linear(len(self.hidden_layers) * target_hidden_size, hidden, **kw)
        self.midlayer = Eagle3Layer(arch, norm_before_residual=norm_before_residual, **kw)
        self.extra_layers = nn.ModuleList(HeadLayer(arch, hidden, **kw) for _ in range(num_layers - 1))
        self.norm = RMSNorm(hidden, arch.rms_norm_eps, **kw)
        self.lm_head = Linear(hidden, draft_vocab_size, **kw)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.int64, device=device))
        self.register_buffer("t2d", torch.zeros(arch.vocab_size, dtype=torch.bool, device=device))
        self.register_buffer("embed_weight", embed_weight.detach().to(**kw), persistent=False)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features)

    def forward(self, hidden: torch.Tensor, token_ids: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        layer = self.midlayer
        normed = layer.hidden_norm(hidden)
        attn_in = torch.cat([layer.input_layernorm(F.embedding(token_ids, self.embed_weight)), normed], dim=-1)
        out = layer.block(attn_in, normed if layer.norm_before_residual else hidden, functools.partial(attention, 0))
        for i, extra in enumerate(self.extra_layers, 1):
            out = extra.block(extra.input_layernorm(out), out, functools.partial(attention, i))
        return out

    @property
    def num_layers(self) -> int:
        return 1 + len(self.extra_layers)

    def recycle(self, out: torch.Tensor) -> torch.Tensor:
        return out  # the pre-norm layer output; fc is for target features only

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(out))


def load_eagle3(directory: str | Path, target: Transformer, *, target_layers: Optional[Sequence[int]] = None,
                dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Eagle3Head:
    """An EAGLE-3 head for ``target`` from a checkpoint directory; ConfigError naming file/field/tensor."""
    ckpt = Checkpoint(directory)
    if any(name.endswith("eh_proj.weight") for name in ckpt.tensors):
        raise ConfigError([f"{ckpt.directory}: an MTP module, not an EAGLE-3 head (use method=mtp)"])
    ckpt.config = {**ckpt.config, **ckpt.config.get("transformer_layer_config", {})}  # speculators format
    for key in REQUIRED_FIELDS:
        ckpt.field(key)
    try:
        arch = ModelArch.from_hf_config({**ckpt.config, "model_type": "llama", "num_hidden_layers": 1,
                                         "architectures": ["LlamaForCausalLM"]})
        num_layers = ckpt.field("num_hidden_layers", 1)
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= MAX_LAYERS:
            raise UnsupportedArchitectureError(
                f"num_hidden_layers={num_layers!r} must be an integer in 1..{MAX_LAYERS}")
    except UnsupportedArchitectureError as err:
        raise ConfigError([f"{ckpt.config_file}: {err}"]) from None
    tarch = target.arch
    target_hidden = ckpt.field("target_hidden_size", None) or arch.hidden_size
    problems = []
    if arch.vocab_size != tarch.vocab_size:
        problems.append(f"vocab_size={arch.vocab_size} but the target's vocabulary has {tarch.vocab_size} tokens")
    if target_hidden != tarch.hidden_size:
        problems.append(f"target_hidden_size={target_hidden} but the target's hidden size is {tarch.hidden_size}")
    if problems:
        raise ConfigError([f"{ckpt.config_file}: {p}" for p in problems])
    layers = _layers(ckpt, target_layers, tarch.num_layers)
    ckpt.rename(_canonical)
    embed = ckpt.tensors.get("embed_tokens.weight", target.embed_tokens.weight)
    if embed.shape != (tarch.vocab_size, arch.hidden_size):
        raise ConfigError([f"{ckpt.directory}: embed_tokens.weight must be [{tarch.vocab_size}, {arch.hidden_size}] "
                           f"(a head narrower than its target needs its own embedding), got {tuple(embed.shape)}"])
    draft_vocab = ckpt.field("draft_vocab_size", None)
    draft_vocab = arch.vocab_size if draft_vocab is None else draft_vocab
    if isinstance(draft_vocab, bool) or not isinstance(draft_vocab, int) or not 1 <= draft_vocab <= tarch.vocab_size:
        raise ConfigError([f"{ckpt.config_file}: draft_vocab_size={draft_vocab!r} must be an integer in "
                           f"[1, {tarch.vocab_size}] (the target's vocabulary size)"])
    head = Eagle3Head(arch, target_hidden_size=target_hidden, hidden_layers=layers, draft_vocab_size=draft_vocab,
                      embed_weight=embed, norm_before_residual=bool(ckpt.field("norm_before_residual", False)),
                      num_layers=num_layers, dtype=dtype, device=device)
    ckpt.load_into(head, optional=("t2d", "d2t") if draft_vocab == arch.vocab_size else ("t2d",))
    check_d2t(head.d2t, tarch.vocab_size, ckpt.sources.get("d2t", ckpt.directory))
    return head.eval()


def save_eagle3(head: Eagle3Head, directory: str | Path) -> Path:
    """Write ``head`` in the published EAGLE-3 layout (see the module doc)."""
    config = {
        **arch_config(head.arch), "architectures": [ARCHITECTURE], "model_type": "llama",
        "num_hidden_layers": head.num_layers,
        "tie_word_embeddings": False, "draft_vocab_size": head.draft_vocab_size,
        "target_hidden_size": head.fc.in_features // len(head.hidden_layers),
        "eagle_aux_hidden_state_layer_ids": [layer + 1 for layer in head.hidden_layers],  # input-to-layer ids
        "norm_before_residual": head.midlayer.norm_before_residual,
    }
    return save_checkpoint(directory, config, {_published(name): t for name, t in head.state_dict().items()})


def default_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low/mid/high layers (output-of-layer ids 1, N/2-1, N-4), or a ConfigError for N < 4."""
    if num_layers < 4:
        raise ConfigError([f"the target has {num_layers} layers, too few for EAGLE-3's default feature layers: "
                           "set method.target_layers=[low,mid,high]"])
    return eagle3_default_layers(num_layers)


def _canonical(name: str) -> str:
    """Published variants of the tensor names -> this module's names (``layers.0.``: the midlayer,
    ``layers.i.``: ``extra_layers.{i-1}.``)."""
    name = name.removeprefix("model.")
    if not name.startswith("layers."):
        return name
    index, rest = name.removeprefix("layers.").split(".", 1)
    return f"midlayer.{rest}" if index == "0" else f"extra_layers.{int(index) - 1}.{rest}"


def _published(name: str) -> str:
    """This module's tensor names -> the published ``layers.i.`` for the plain layers (the midlayer keeps its name)."""
    if not name.startswith("extra_layers."):
        return name
    index, rest = name.removeprefix("extra_layers.").split(".", 1)
    return f"layers.{int(index) + 1}.{rest}"


def _layers(ckpt: Checkpoint, override: Optional[Sequence[int]], num_layers: int) -> tuple[int, ...]:
    """Output-of-layer ids: the override, else the checkpoint's (input-to-layer) ids, else EAGLE-3's default."""
    if override:
        return check_layers(override, num_layers, "method.target_layers")
    stored = ckpt.field("eagle_aux_hidden_state_layer_ids", None) or (
        ckpt.field("eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids")
    if not stored:
        return default_layers(num_layers)
    source = f"{ckpt.config_file}: eagle_aux_hidden_state_layer_ids"
    try:
        return check_layers(layer_ids_from_input_convention(list(stored)), num_layers, source)
    except ValueError as err:
        raise ConfigError([f"{source}: {err}"]) from None


def check_layers(layers: Sequence[int], num_layers: int, source: str) -> tuple[int, ...]:
    """Three output-of-layer ids inside the target, else a ConfigError naming ``source``."""
    if len(layers) != 3 or not all(0 <= layer < num_layers for layer in layers):
        raise ConfigError([f"{source}: need 3 layer ids in 0..{num_layers - 1} (output-of-layer), got {list(layers)}"])
    return tuple(layers)


@DRAFTERS.register("eagle3")
def build_eagle3(cfg: Eagle3MethodConfig, deps: DrafterDeps) -> Drafter:
    path = cfg.checkpoint or shipped_checkpoint("eagle3", "checkpoint")
    head = load_head(load_eagle3, path, cfg.head_dtype, deps, target_layers=cfg.target_layers)
    if cfg.drafts_a_tree:
        return TreeFeatureDrafter(head, deps.target, num_slots=deps.num_slots, max_seq_len=deps.max_seq_len,
                                  policy=cfg.draft_policy, topk=cfg.tree_topk, max_depth=cfg.num_draft_tokens)
    return FeatureDrafter(head, deps.target, num_slots=deps.num_slots, max_seq_len=deps.max_seq_len,
                          policy=cfg.draft_policy)
