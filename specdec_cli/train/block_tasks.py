"""Stage 3 objectives of the block drafters: PARD and DFlash as trainer tasks (see ``tasks.py``).

Both draft K tokens in one forward from mask tokens, so their evaluation chains are not unrolled: the
draft for chain step j of the anchor whose last committed token sits at position c (row c of ``matches``,
as ``DraftModelTask``) comes from one forward over the committed tokens x_0..x_c and j+1 drafted
positions of mask tokens, exactly the view the drafter has at inference. Step j matches when that
draft equals the target's argmax at c + j (its prediction of x_{c+1+j}); it is valid when x_{c+1+j}
is a response token inside the sequence.

The random parts of a training batch (PARD's dropped entries, DFlash's anchors) are drawn with a
generator seeded by the batch's tokens, so the batch of a step is the same in a resumed run.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F

from specdec_cli.drafters.dflash import DFlashDraft, save_dflash
from specdec_cli.drafters.pard import save_pard
from specdec_cli.models import Transformer
from specdec_cli.train.dflash_objective import build_dflash_batch, dflash_loss
from specdec_cli.train.pard_objective import build_pard_batch, pard_hidden, pard_loss
from specdec_cli.train.tasks import Batch, Task, teacher_argmax

#: DFlash evaluation: anchors decoded per forward (bounds the [R, A*B, L + A*B] attention)
EVAL_ANCHORS = 64


def default_mask_token_id(tokenizer: Any, vocab_size: int) -> int:
    """The mask token of a new PARD / DFlash draft when none is given: the first vocabulary row past the
    tokenizer (padding rows that no text produces, as the published Qwen drafts use), else the tokenizer's
    mask token, else its highest-id special added token that is not BOS/EOS/PAD/UNK or another named
    special token (SmolLM2: 16, ``<empty_output>``), else the last vocabulary row (no tokenizer: toy models)."""
    if tokenizer is None:
        return vocab_size - 1
    if len(tokenizer) < vocab_size:
        return len(tokenizer)
    mask = getattr(tokenizer, "mask_token_id", None)
    if isinstance(mask, int) and 0 <= mask < vocab_size:
        return mask
    named = set(getattr(tokenizer, "all_special_ids", []) or [])
    named |= {getattr(tokenizer, f"{name}_token_id", None) for name in ("bos", "eos", "pad", "unk")}
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    spare = [i for i, token in added.items() if getattr(token, "special", False) and i not in named and i < vocab_size]
    return max(spare) if spare else vocab_size - 1


def batch_generator(batch: Batch, length: int, seed: int) -> torch.Generator:
    """A CPU generator seeded by the batch's tokens (and ``seed``): reproducible per step, resume included."""
    digest = hashlib.blake2b(batch.tokens[:, :length].cpu().numpy().tobytes(), digest_size=8).digest()
    return torch.Generator().manual_seed((int.from_bytes(digest, "little") ^ seed) & (2**63 - 1))


def response_steps(batch: Batch, k: int) -> torch.Tensor:
    """valid [B, L, k]: x_{p+1+j} is a response token inside the sequence (row p = last committed token)."""
    return torch.stack([batch.predicts_response(1 + j) for j in range(k)], -1)


class PardTask(Task):
    """PARD: a small causal LM (the target's tokenizer) over the sequence expanded into ``depth`` mask
    groups with conditional drop-token (``keep_ratio``, ``min_keep_ratio``; ``pard_objective``); the
    soft label of every kept entry is the target's next-token distribution at its position."""

    def __init__(self, model: Transformer, target: Transformer, *, mask_token_id: int, depth: int,
                 keep_ratio: float = 0.7, min_keep_ratio: float = 0.2, tokenizer: Any = None, seed: int = 0,
                 save_dtype: Optional[torch.dtype] = torch.float16) -> None:
        self.module, self.model, self.tokenizer = model, model, tokenizer
        self.mask_token_id, self.depth, self.seed = mask_token_id, depth, seed
        self.keep_ratio, self.min_keep_ratio, self.save_dtype = keep_ratio, min_keep_ratio, save_dtype
        self.feature_layers, self.pad = (), 0
        self.teacher_full_weight = target.lm_head.weight.detach().float()

    def loss(self, batch: Batch) -> tuple[torch.Tensor, list[float]]:
        length = batch.features.shape[1]
        pard = build_pard_batch(batch.tokens[:, :length], batch.lengths, batch.prompt_lens, depth=self.depth,
                                mask_token_id=self.mask_token_id, keep_ratio=self.keep_ratio,
                                min_keep_ratio=self.min_keep_ratio, generator=batch_generator(batch, length, self.seed))
        return pard_loss(self.model, pard, batch.final(0), self.teacher_full_weight)

    @torch.no_grad()
    def matches(self, batch: Batch, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Entry (j, c + j) of an undropped depth-k expansion is draft j+1 after x_c; one sequence per
        forward (its [N, N] attention, N < k * L). The expansion treats the last k prompt tokens as
        response, so that every valid step (even of an anchor whose first step is a prompt token) has its entry."""
        rows, length = batch.features.shape[:2]
        match = torch.zeros(rows, length, k, dtype=torch.bool, device=batch.tokens.device)
        for row in range(rows):
            pard = build_pard_batch(batch.tokens[row : row + 1, :length], batch.lengths[row : row + 1],
                                    (batch.prompt_lens[row : row + 1] - k).clamp_min(0), depth=k,
                                    mask_token_id=self.mask_token_id, keep_ratio=1.0)
            drafts = teacher_argmax(pard_hidden(self.model, pard), self.model.lm_head.weight)[0]
            kept = pard.depth[0] >= 0
            step, position = pard.depth[0][kept], pard.position_ids[0][kept]
            match[row, position - step, step] = drafts[kept] == batch.teacher_argmax[row, position]
        return match, response_steps(batch, k)

    def save(self, directory: Path) -> Path:
        return save_pard(self.model, directory, mask_token_id=self.mask_token_id, tokenizer=self.tokenizer,
                         dtype=self.save_dtype)


class DflashTask(Task):
    """DFlash: blocks [x_a, m, ..., m] of ``draft.block_size`` tokens at ``num_anchors`` random response
    anchors per sequence, conditioned on the target features of the positions before the anchor
    (``dflash_objective``); block position j's soft label is the target's distribution of x_{a+j}."""

    def __init__(self, draft: DFlashDraft, target: Transformer, *, num_anchors: int = 16, gamma: float = 7.0,
                 seed: int = 0, save_dtype: Optional[torch.dtype] = torch.float16) -> None:
        self.module, self.draft = draft, draft
        self.num_anchors, self.gamma, self.seed, self.save_dtype = num_anchors, gamma, seed, save_dtype
        self.feature_layers, self.pad = draft.target_layers, 0
        self.teacher_full_weight = target.lm_head.weight.detach().float()

    def _features(self, batch: Batch) -> torch.Tensor:
        """The draft's ``target_layers`` outputs: the first columns of the batch's features."""
        return batch.features[..., : len(self.draft.target_layers) * batch.hidden_size].to(self.draft.head_weight.dtype)

    def loss(self, batch: Batch) -> tuple[torch.Tensor, list[float]]:
        length = batch.features.shape[1]
        blocks = build_dflash_batch(batch.tokens[:, :length], batch.lengths, batch.prompt_lens,
                                    block_size=self.draft.block_size, num_anchors=self.num_anchors,
                                    mask_token_id=self.draft.mask_token_id, gamma=self.gamma,
                                    generator=batch_generator(batch, length, self.seed))
        return dflash_loss(self.draft, blocks, self._features(batch), batch.final(0), self.teacher_full_weight)

    @torch.no_grad()
    def matches(self, batch: Batch, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """An anchor at every position (``EVAL_ANCHORS`` per forward); a block gives block_size - 1 drafts,
        so steps past that never match (as at inference, where the drafter proposes fewer)."""
        draft, device = self.draft, batch.tokens.device
        rows, length = batch.features.shape[:2]
        size, steps = draft.block_size, min(k, draft.block_size - 1)
        kv = draft.context_kv(draft.fuse(self._features(batch)).reshape(rows * length, -1),
                              torch.arange(length, device=device).repeat(rows))
        context = [tuple(t.view(rows, length, *t.shape[1:]).transpose(1, 2) for t in pair) for pair in kv]
        teacher = F.pad(batch.teacher_argmax, (0, size), value=-1)
        match = torch.zeros(rows, length, k, dtype=torch.bool, device=device)
        offsets = torch.arange(size, device=device)
        for start in range(0, length, EVAL_ANCHORS):
            anchors = torch.arange(start, min(start + EVAL_ANCHORS, length), device=device)
            count = anchors.numel()
            block = torch.full((rows, count, size), draft.mask_token_id, dtype=torch.int64, device=device)
            block[..., 0] = batch.tokens[:, anchors]
            positions = (anchors[:, None] + offsets).reshape(1, -1).expand(rows, -1)
            sees_context = torch.arange(length, device=device)[None] < anchors.repeat_interleave(size)[:, None]
            block_of = torch.arange(count, device=device).repeat_interleave(size)
            mask = torch.cat([sees_context, block_of[:, None] == block_of[None]], -1).expand(rows, -1, -1)
            hidden = draft.decode(block.view(rows, -1), positions, context, mask).view(rows, count, size, -1)
            drafts = teacher_argmax(hidden[:, :, 1 : steps + 1], draft.head_weight)  # [R, A, steps]
            match[:, start : start + count, :steps] = drafts == teacher[:, anchors[:, None] + offsets[:steps]]
        return match, response_steps(batch, k)

    def save(self, directory: Path) -> Path:
        return save_dflash(self.draft, directory, dtype=self.save_dtype)
