"""Fresh drafters for a target, ready to train: EAGLE-3 and MTP heads, a truncated draft model,
and the reduced draft vocabulary (d2t) built from token frequencies.

Shared parts are the target's own tensors and stay frozen: the token embedding (every method),
the LM head (MTP: rows of it; draft_target: all of it). New matrices start as N(0, 0.02), norms at 1.
Trainable weights are float32 whatever the target's dtype.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch import nn

from specdec_cli.drafters.eagle3 import Eagle3Head, check_layers, default_layers
from specdec_cli.drafters.learned import arch_config, save_checkpoint
from specdec_cli.drafters.mtp import MtpHead, shared_head_rows
from specdec_cli.models import ModelArch, Transformer
from specdec_cli.sampling import draft_ids_of

INIT_STD = 0.02


def draft_vocabulary(response_counts: torch.Tensor, prompt_counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` target ids of the draft vocabulary, ascending [Vd]: the most frequent response tokens,
    then (for ties and unseen ids) the most frequent prompt tokens, then the lowest ids (EAGLE-3 §3.5)."""
    vocab = response_counts.numel()
    order = torch.arange(vocab)
    for key in (prompt_counts, response_counts):  # stable sorts: the last key is the primary one
        order = order[torch.sort(-key[order].double(), stable=True).indices]
    return order[: min(size, vocab)].sort().values


def vocab_maps(used_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [Vd] offsets: target = draft + d2t[draft], t2d [V] bool membership) for ascending ``used_ids``."""
    d2t = used_ids - torch.arange(used_ids.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used_ids] = True
    return d2t, t2d


@torch.no_grad()
def init_new(module: nn.Module, seed: int) -> None:
    """N(0, INIT_STD) matrices, unit norm weights, zero biases (seeded)."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in module.named_parameters():
        if name.endswith("bias"):
            param.zero_()
        elif param.dim() == 1:
            param.fill_(1.0)
        else:
            param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)


def head_arch(target: ModelArch) -> ModelArch:
    """A one-layer Llama block with the target's shapes (EAGLE-3 heads are Llama layers for any target)."""
    return dataclasses.replace(target, num_layers=1, model_type="llama", qk_norm=False, attention_bias=False,
                               o_proj_bias=False, mlp_bias=False, sliding_window=None)


def new_eagle3(target: Transformer, used_ids: torch.Tensor, *, hidden_layers: Optional[Sequence[int]] = None,
               seed: int = 0, num_layers: int = 1) -> Eagle3Head:
    """A random EAGLE-3 head of ``num_layers`` layers for ``target`` over the draft vocabulary ``used_ids``;
    its lm_head starts as the target's rows for those ids."""
    arch = target.arch
    if hidden_layers:
        layers = check_layers(hidden_layers, arch.num_layers, "method.target_layers")
    else:
        layers = default_layers(arch.num_layers)
    head = Eagle3Head(head_arch(arch), target_hidden_size=arch.hidden_size, hidden_layers=layers,
                      draft_vocab_size=used_ids.numel(), embed_weight=target.embed_tokens.weight,
                      num_layers=num_layers, dtype=torch.float32, device=target.device)
    init_new(head, seed)
    d2t, t2d = vocab_maps(used_ids, arch.vocab_size)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.lm_head.weight[used_ids.to(target.device)])
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)
    return head


def _eagle3_like(head: Eagle3Head, **changes: int) -> Eagle3Head:
    """An uninitialised EAGLE-3 head shaped as ``head`` (same device and dtype), ``changes`` aside."""
    shape = {"draft_vocab_size": head.draft_vocab_size, "num_layers": head.num_layers, **changes}
    return Eagle3Head(head.arch, target_hidden_size=head.fc.weight.shape[1] // len(head.hidden_layers),
                      hidden_layers=head.hidden_layers, embed_weight=head.embed_weight,
                      norm_before_residual=head.midlayer.norm_before_residual, dtype=head.fc.weight.dtype,
                      device=head.fc.weight.device, **shape)


@torch.no_grad()
def revocab_eagle3(head: Eagle3Head, target: Transformer, used_ids: torch.Tensor) -> Eagle3Head:
    """``head`` (trained) over a new draft vocabulary ``used_ids`` (ascending [Vd']): every weight is kept, the
    lm_head rows of ids in both vocabularies too; ids new to the head start as the target's rows (as a fresh
    head's do: a trained head's rows stay close to them)."""
    device = head.fc.weight.device
    wide = _eagle3_like(head, draft_vocab_size=used_ids.numel())
    missing, _ = wide.load_state_dict({k: v for k, v in head.state_dict().items()
                                       if not k.startswith(("lm_head", "d2t", "t2d"))}, strict=False)
    assert set(missing) == {"lm_head.weight", "d2t", "t2d"}, missing
    rows = target.lm_head.weight[used_ids.to(target.lm_head.weight.device)].to(wide.lm_head.weight)
    old_rows = draft_ids_of(head.d2t, head.draft_vocab_size, target.arch.vocab_size)[used_ids.cpu()].to(device)
    kept = old_rows >= 0
    rows[kept] = head.lm_head.weight[old_rows[kept]].to(rows.dtype)
    wide.lm_head.weight.copy_(rows)
    d2t, t2d = vocab_maps(used_ids.cpu(), target.arch.vocab_size)
    wide.d2t.copy_(d2t)
    wide.t2d.copy_(t2d)
    return wide


@torch.no_grad()
def deepen_eagle3(head: Eagle3Head, num_layers: int, seed: int = 0) -> Eagle3Head:
    """``head`` (trained) with plain layers appended up to ``num_layers``; each new layer starts as the identity
    (its o_proj and down_proj zero, the rest as ``init_new``), so the deeper head drafts as ``head`` did."""
    if num_layers < head.num_layers:
        raise ValueError(f"cannot deepen a {head.num_layers}-layer head to {num_layers} layers")
    deep = _eagle3_like(head, num_layers=num_layers)
    for i, layer in enumerate(deep.extra_layers[head.num_layers - 1 :]):
        init_new(layer, seed + i)
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    missing, unexpected = deep.load_state_dict(head.state_dict(), strict=False)
    assert not unexpected and all(name.startswith("extra_layers.") for name in missing), (missing, unexpected)
    return deep


def new_mtp(target: Transformer, used_ids: Optional[torch.Tensor], *, seed: int = 0) -> MtpHead:
    """A random MTP module for ``target`` (its shared_head.norm starts as the target's final norm);
    ``used_ids`` None: the full target vocabulary."""
    d2t = None if used_ids is None else vocab_maps(used_ids, target.arch.vocab_size)[0]
    head = MtpHead(dataclasses.replace(target.arch, num_layers=1), embed_weight=target.embed_tokens.weight,
                   lm_weight=shared_head_rows(target, d2t), d2t=d2t, dtype=torch.float32, device=target.device)
    init_new(head, seed)
    with torch.no_grad():
        head.shared_head.norm.weight.copy_(target.norm.weight)
    return head


def new_draft_model(target: Transformer, num_layers: int) -> Transformer:
    """The target's first ``num_layers`` layers and final norm as a separate, trainable model; its
    embedding and LM head are copies of the target's and stay frozen."""
    arch = dataclasses.replace(target.arch, num_layers=num_layers)
    model = Transformer(arch, dtype=torch.float32, device=target.device)
    state = {name: tensor for name, tensor in target.state_dict().items()
             if not name.startswith("layers.") or int(name.split(".")[1]) < num_layers}
    model.load_state_dict(state)
    model.requires_grad_(True)
    model.embed_tokens.weight.requires_grad_(False)
    model.lm_head.weight.requires_grad_(False)
    return model


def save_draft_model(model: Transformer, directory: str | Path, tokenizer: Any = None) -> Path:
    """A HF-style model directory (config.json + model.safetensors + the tokenizer) for ``load_model``."""
    tied = model.arch.tie_word_embeddings
    tensors = {(name if name.startswith("lm_head") else f"model.{name}"): tensor
               for name, tensor in model.state_dict().items() if not (tied and name == "lm_head.weight")}
    save_checkpoint(directory, arch_config(model.arch), tensors)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    return Path(directory)
