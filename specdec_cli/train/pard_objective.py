"""PARD's training objective (reference/methods.md §4.3): pure functions for ``specdec train`` to call.

Each sequence is expanded into parallel copies at mask depths g = 0..K-1 (K = ``depth``, PARD's
``para_num``). Depth 0 is the sequence itself; at depth g >= 1 a mask token sits at position p (position
id p) and sees the real tokens x_0..x_{p-g} plus the mask chain (1, p-g+1), ..., (g, p): exactly the
causal view [x_0 .. x_{p-g}, m x g] that the drafter feeds at inference. Entry (g, p) learns the
target's next-token distribution at p (the law of x_{p+1}), i.e. draft g+1 after the last real token.

Conditional drop-token (COD) bounds the cost: depth 0 is kept whole; depth g keeps
floor(n * max(r^g, r_min)) entries (n = depth-0 entries with a loss), drawn at random among the
candidates whose predecessor (g-1, p-1) is kept, so every kept mask has its whole prefix chain.
Only entries whose label x_{p+1} is a response token carry a loss.

Shapes: R sequences, ``tokens`` [R, >= L] int64 (zero padded), ``lengths`` / ``prompt_lens`` [R];
N = the longest expanded row (< K * L); H = the draft's hidden size, Ht the target's, V the vocabulary.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, TypeVar

import torch
from torch import nn

from specdec_cli.drafters.dflash import masked_layer
from specdec_cli.models import Transformer
from specdec_cli.train.tasks import soft_cross_entropy

INIT_STD = 0.02
BatchT = TypeVar("BatchT")


@dataclass
class PardBatch:
    """One PARD batch (R rows of N entries; padding entries have depth -1 and weight 0).

    input_ids [R, N] int64: x_p at depth 0, the mask token at depths >= 1 (and padding);
    position_ids [R, N] int64: p; depth [R, N] int64: g;
    attention [R, N, N] bool: True = may attend (see the module doc);
    teacher_index [R, N] int64: p, the row of the target's distributions that is the soft label;
    weight [R, N] float32: 1 where x_{p+1} is a response token, else 0.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    depth: torch.Tensor
    attention: torch.Tensor
    teacher_index: torch.Tensor
    weight: torch.Tensor


def on_device(batch: BatchT, device: torch.device) -> BatchT:
    """``batch`` (a dataclass of tensors and plain values) with its tensors moved to ``device``."""
    return dataclasses.replace(batch, **{f.name: getattr(batch, f.name).to(device) for f in dataclasses.fields(batch)
                                         if isinstance(getattr(batch, f.name), torch.Tensor)})


def build_pard_batch(tokens: torch.Tensor, lengths: torch.Tensor, prompt_lens: torch.Tensor, *, depth: int,
                     mask_token_id: int, keep_ratio: float = 0.7, min_keep_ratio: float = 0.2,
                     generator: Optional[torch.Generator] = None) -> PardBatch:
    """The expanded PARD batch of ``depth`` groups with COD (``keep_ratio`` r, ``min_keep_ratio`` r_min;
    r = 1 keeps every candidate), on ``tokens.device``. ``generator`` (CPU) makes the drop reproducible."""
    device = tokens.device
    tokens, lengths, prompt_lens = tokens.cpu(), lengths.cpu(), prompt_lens.cpu()
    entries = []
    for row in range(tokens.shape[0]):
        length, prompt = int(lengths[row]), int(prompt_lens[row])
        groups = [torch.arange(length)]
        budget = int(((groups[0] + 1 >= prompt) & (groups[0] + 1 < length)).sum())
        for g in range(1, depth):
            candidates = groups[-1] + 1
            candidates = candidates[(candidates + 1 >= prompt) & (candidates + 1 < length)]
            keep = int(budget * max(keep_ratio**g, min_keep_ratio))
            if keep < candidates.numel():
                picked = torch.randperm(candidates.numel(), generator=generator)[:keep]
                candidates = candidates[picked].sort().values
            groups.append(candidates)
        entries.append((torch.cat(groups), torch.cat([torch.full((len(p),), g) for g, p in enumerate(groups)])))
    num = max(p.numel() for p, _ in entries)
    positions = torch.zeros(len(entries), num, dtype=torch.int64)
    depths = torch.full((len(entries), num), -1, dtype=torch.int64)
    for row, (p, g) in enumerate(entries):
        positions[row, : p.numel()], depths[row, : p.numel()] = p, g
    pos_q, pos_k = positions[:, :, None], positions[:, None, :]
    dep_q, dep_k = depths[:, :, None], depths[:, None, :]
    real = (dep_k == 0) & (pos_k <= pos_q - dep_q)
    chain = (dep_k >= 1) & (dep_k <= dep_q) & (pos_q - pos_k == dep_q - dep_k)
    attention = ((real | chain) & (dep_q >= 0)) | torch.eye(num, dtype=torch.bool)  # padding: only itself
    input_ids = torch.where(depths == 0, tokens.gather(1, positions.clamp_max(tokens.shape[1] - 1)), mask_token_id)
    label = positions + 1
    weight = (depths >= 0) & (label >= prompt_lens[:, None]) & (label < lengths[:, None])
    return on_device(PardBatch(input_ids, positions, depths, attention, positions.clone(), weight.float()), device)


def pard_hidden(model: Transformer, batch: PardBatch) -> torch.Tensor:
    """The draft's normed hidden states [R, N, H] over a PARD batch (differentiable)."""
    model.rope.ensure(int(batch.position_ids.max()) + 1)
    cos, sin = model.rope.lookup(batch.position_ids.reshape(-1))
    x = model.embed_tokens(batch.input_ids)
    for layer in model.layers:
        x = masked_layer(layer, x, cos, sin, batch.attention)
    return model.norm(x)


def gather_rows(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values [R, L, X] at index [R, N] (clamped into 0..L-1) -> [R, N, X]."""
    index = index.clamp(0, values.shape[1] - 1)
    return values.gather(1, index[..., None].expand(-1, -1, values.shape[-1]))


def pard_loss(model: Transformer, batch: PardBatch, teacher_hidden: torch.Tensor,
              teacher_head: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """(mean soft cross-entropy to the target, mean per depth g = 0..K-1) over the weighted entries.

    teacher_hidden [R, L, Ht]: the target's final (post-norm) hidden per position; teacher_head [V, Ht]:
    its LM head, so the soft label of entry (g, p) is softmax(teacher_head @ teacher_hidden[p]).
    """
    hidden = pard_hidden(model, batch)
    selected = batch.weight > 0
    ce = soft_cross_entropy(hidden[selected], model.lm_head, gather_rows(teacher_hidden, batch.teacher_index)[selected],
                            teacher_head)
    weight = batch.weight[selected]
    loss = (ce * weight).sum() / weight.sum().clamp_min(1.0)
    depth, ce = batch.depth[selected], ce.detach()
    per_depth = [float(ce[depth == g].mean()) if bool((depth == g).any()) else 0.0
                 for g in range(int(batch.depth.max()) + 1)]
    return loss, per_depth


@torch.no_grad()
def init_weights(module: nn.Module, seed: int) -> None:
    """N(0, INIT_STD) matrices, unit vectors (norm weights), seeded."""
    generator = torch.Generator().manual_seed(seed)
    for param in module.parameters():
        if param.dim() == 1:
            param.fill_(1.0)
        else:
            param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)


@torch.no_grad()
def init_pard_from_target(target: Transformer, num_layers: int, *, hidden_size: int = 128,
                          seed: int = 0) -> Transformer:
    """A fresh PARD draft for ``target``'s tokenizer: ``num_layers`` Llama layers of width ``hidden_size``
    (a multiple of the target's head dim, at most its hidden size; heads, KV heads and MLP width scaled
    from the target), embeddings tied if the target's are. The embedding (and an untied LM head) start as
    the target's projected on the top ``hidden_size`` principal directions of its embedding; the layers
    are random. SmolLM2-135M, 4 layers of width 128: 7.0 M parameters (14 MB in float16)."""
    arch = target.arch
    if not 0 < hidden_size <= arch.hidden_size or hidden_size % arch.head_dim:
        raise ValueError(f"hidden_size={hidden_size} must be a multiple of the head dim {arch.head_dim} "
                         f"and at most the target's hidden size {arch.hidden_size}")
    heads = hidden_size // arch.head_dim
    kv_heads = max(1, heads // arch.num_groups)
    while heads % kv_heads:
        kv_heads -= 1
    width = max(8, round(arch.intermediate_size * hidden_size / arch.hidden_size / 8) * 8)
    draft_arch = dataclasses.replace(arch, hidden_size=hidden_size, num_layers=num_layers, num_heads=heads,
                                     num_kv_heads=kv_heads, intermediate_size=width, model_type="llama",
                                     qk_norm=False, attention_bias=False, o_proj_bias=False, mlp_bias=False,
                                     sliding_window=None)
    model = Transformer(draft_arch, dtype=target.dtype, device=target.device)
    init_weights(model, seed)
    embed = target.embed_tokens.weight.float()
    basis = torch.linalg.eigh(embed.T @ embed).eigenvectors[:, -hidden_size:]  # [Ht, H], top directions
    model.embed_tokens.weight.copy_(embed @ basis)
    if not draft_arch.tie_word_embeddings:
        model.lm_head.weight.copy_(target.lm_head.weight.float() @ basis)
    return model
