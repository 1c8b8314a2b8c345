"""DFlash's block objective (reference/methods.md §5.3): pure functions for ``specdec train`` to call.

Per sequence, up to A anchors a are drawn at random among the response positions (a >= prompt length,
a + 1 < length: the anchor is a committed token and its block has a label). Each anchor gives a block
[x_a, m, ..., m] of B tokens at positions a..a+B-1, all decoded in one non-causal forward: a block
sees the context features of the positions strictly before its anchor (the anchor's own features are
unknown at inference) and the whole of its own block; blocks never see each other. Block position
j = 1..B-1 learns the target's distribution of x_{a+j} (its next-token distribution at a+j-1; same
position, no shift), weighted exp(-(j-1) / gamma) while a+j is inside the sequence.

Shapes: R sequences, ``tokens`` [R, >= L] int64 (zero padded), ``lengths`` / ``prompt_lens`` [R] with
L = max(lengths) the context length; A anchors, B = block size, N = A * B block tokens per sequence;
features [R, L, n*Ht] (the draft's ``target_layers`` outputs, concatenated), V the vocabulary.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from specdec_cli.drafters.dflash import DFlashDraft
from specdec_cli.models import Transformer
from specdec_cli.train.pard_objective import gather_rows, init_weights, on_device
from specdec_cli.train.tasks import soft_cross_entropy


@dataclass
class DFlashBatch:
    """Blocks of one DFlash batch (padding anchors sit at 0 with weight 0).

    anchors [R, A] int64; block_ids [R, N] int64: x_a then B-1 mask tokens per block; positions [R, N]:
    a + j; attention [R, N, L + N] bool (True = may attend): context keys j < a, then the own block;
    teacher_index [R, N]: a + j - 1, the row of the target's distributions that is the soft label;
    weight [R, N] float32: the loss weight (0 at j = 0, past the sequence and for padding anchors).
    """

    anchors: torch.Tensor
    block_ids: torch.Tensor
    positions: torch.Tensor
    attention: torch.Tensor
    teacher_index: torch.Tensor
    weight: torch.Tensor
    block_size: int


def build_dflash_batch(tokens: torch.Tensor, lengths: torch.Tensor, prompt_lens: torch.Tensor, *, block_size: int,
                       num_anchors: int, mask_token_id: int, gamma: float = 7.0,
                       generator: Optional[torch.Generator] = None) -> DFlashBatch:
    """Random anchors (at most ``num_anchors`` per sequence, drawn with the CPU ``generator``) and their
    blocks, on ``tokens.device``."""
    device = tokens.device
    tokens, lengths, prompt_lens = tokens.cpu(), lengths.cpu(), prompt_lens.cpu()
    rows = tokens.shape[0]
    anchors = torch.zeros(rows, num_anchors, dtype=torch.int64)
    valid = torch.zeros(rows, num_anchors, dtype=torch.bool)
    for row in range(rows):
        eligible = torch.arange(max(int(prompt_lens[row]), 1), int(lengths[row]) - 1)
        picked = eligible[torch.randperm(eligible.numel(), generator=generator)[:num_anchors]].sort().values
        anchors[row, : picked.numel()], valid[row, : picked.numel()] = picked, True
    offsets = torch.arange(block_size)
    positions = (anchors[..., None] + offsets).reshape(rows, -1)
    block_ids = torch.full((rows, num_anchors, block_size), mask_token_id, dtype=torch.int64)
    block_ids[..., 0] = tokens.gather(1, anchors)
    context_len = int(lengths.max())
    anchor_of = anchors.repeat_interleave(block_size, dim=1)  # [R, N]
    sees_context = torch.arange(context_len)[None, None, :] < anchor_of[..., None]
    block_of = torch.arange(num_anchors).repeat_interleave(block_size)
    sees_block = (block_of[:, None] == block_of[None, :]).expand(rows, -1, -1)
    decay = torch.tensor([0.0] + [math.exp(-(j - 1) / gamma) for j in range(1, block_size)])
    inside = positions < lengths[:, None]
    weight = decay.repeat(num_anchors)[None] * inside * valid.repeat_interleave(block_size, dim=1)
    batch = DFlashBatch(anchors, block_ids.reshape(rows, -1), positions, torch.cat([sees_context, sees_block], -1),
                        (positions - 1).clamp_min(0), weight.float(), block_size)
    return on_device(batch, device)


def dflash_loss(draft: DFlashDraft, batch: DFlashBatch, features: torch.Tensor, teacher_hidden: torch.Tensor,
                teacher_head: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """(weighted mean soft cross-entropy to the target, mean per block position j = 1..B-1).

    features [R, L, n*Ht]; teacher_hidden [R, L, Ht]: the target's final (post-norm) hidden; teacher_head
    [V, Ht]: its LM head (the soft label of block position j is softmax(teacher_head @ teacher_hidden[a+j-1])).
    """
    if features.shape[1] != batch.attention.shape[-1] - batch.block_ids.shape[1]:
        raise ValueError(f"features cover {features.shape[1]} positions; the batch's context is "
                         f"{batch.attention.shape[-1] - batch.block_ids.shape[1]} (max(lengths))")
    if features.is_inference():  # e.g. computed under torch.inference_mode(): autograd cannot save it
        features = features.clone()
    hidden = draft(features, batch.block_ids, batch.positions, batch.attention)
    selected = batch.weight > 0
    ce = soft_cross_entropy(hidden[selected], draft.logits, gather_rows(teacher_hidden, batch.teacher_index)[selected],
                            teacher_head)
    weight = batch.weight[selected]
    loss = (ce * weight).sum() / weight.sum().clamp_min(1e-6)
    offset = (torch.arange(hidden.shape[1], device=hidden.device) % batch.block_size).expand_as(selected)[selected]
    ce = ce.detach()
    per_position = [float(ce[offset == j].mean()) if bool((offset == j).any()) else 0.0
                    for j in range(1, batch.block_size)]
    return loss, per_position


def default_target_layers(num_target_layers: int, count: int) -> tuple[int, ...]:
    """DFlash's ``build_target_layer_ids``: ``count`` output-of-layer ids evenly spread over 1..N-3
    (the middle layer when count = 1)."""
    if count == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(int(round(1 + i * span / (count - 1))) for i in range(count))


@torch.no_grad()
def init_dflash(target: Transformer, layer_ids: Optional[Sequence[int]] = None, *, mask_token_id: int,
                num_layers: int = 2, block_size: int = 8, seed: int = 0) -> DFlashDraft:
    """A fresh DFlash draft for ``target``: ``num_layers`` Qwen3-style layers (q/k norms) at the target's
    width, reading the target layers ``layer_ids`` (default: ``default_target_layers(N, num_layers)``),
    sharing its embedding and LM head; random weights. SmolLM2-135M, 2 layers: 7.7 M parameters (15 MB
    in float16)."""
    arch = dataclasses.replace(target.arch, num_layers=num_layers, model_type="qwen3", qk_norm=True,
                               attention_bias=False, o_proj_bias=False, mlp_bias=False, sliding_window=None,
                               tie_word_embeddings=False)
    layers = tuple(layer_ids) if layer_ids else default_target_layers(target.arch.num_layers, num_layers)
    draft = DFlashDraft(arch, target_layers=layers, target_hidden_size=target.arch.hidden_size,
                        block_size=block_size, mask_token_id=mask_token_id, embed_weight=target.embed_tokens.weight,
                        head_weight=target.lm_head.weight, dtype=target.dtype, device=target.device)
    init_weights(draft, seed)
    return draft
