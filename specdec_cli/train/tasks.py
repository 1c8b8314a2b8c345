"""Stage 3 objectives: what each learned drafter minimises, how it is evaluated and saved.

Every objective is a soft cross-entropy against the target's own distribution (forward KL up to a
constant; heads may add ``tv_weight`` x the total variation), restricted to rows that predict a
response token. The target distribution of token x_{q+1} is ``softmax(lm_head(final_hidden[q]))``;
for a reduced draft vocabulary only its rows of the LM head are used, which is the target
renormalised over the draft vocabulary (EAGLE-3 §3.4).

Evaluation is teacher-forced on held-out responses: chain step j of an anchor matches when the
draft's argmax (mapped to target ids) equals the target's argmax at that position; heads also give
the chance that step j, sampled at T=1, is accepted (``overlap``).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from specdec_cli.drafters.eagle3 import Eagle3Head, save_eagle3
from specdec_cli.drafters.feature_head import FeatureHead
from specdec_cli.drafters.mtp import MtpHead, save_mtp, shared_head_rows
from specdec_cli.models import Transformer
from specdec_cli.models.rope import RotaryTables
from specdec_cli.sampling import draft_to_target_ids
from specdec_cli.train.heads import save_draft_model
from specdec_cli.train.unroll import model_hidden, unroll_head

#: rows per LM-head chunk in the loss (their logits are recomputed in backward, never all stored)
LOSS_CHUNK = 512


@dataclass
class Batch:
    """tokens [B, L + pad] int64 and features [B, L, F] float32 (zero padded; the last ``hidden_size``
    columns are the target's final hidden), lengths/prompt_lens [B]; teacher_argmax [B, L]: the
    target's argmax next token at each position (evaluation only)."""

    tokens: torch.Tensor
    features: torch.Tensor
    lengths: torch.Tensor
    prompt_lens: torch.Tensor
    hidden_size: int
    teacher_argmax: Optional[torch.Tensor] = None

    @classmethod
    def collate(cls, tokens: list[torch.Tensor], features: list[torch.Tensor], prompt_lens: list[int], *,
                hidden_size: int, pad: int, device: torch.device) -> Batch:
        length = max(t.numel() for t in tokens)
        ids = torch.zeros(len(tokens), length + pad, dtype=torch.int64)
        rows = torch.zeros(len(tokens), length, features[0].shape[-1])
        for i, (seq, feat) in enumerate(zip(tokens, features)):
            ids[i, : seq.numel()], rows[i, : seq.numel()] = seq, feat
        return cls(ids.to(device), rows.to(device), torch.tensor([t.numel() for t in tokens], device=device),
                   torch.tensor(prompt_lens, device=device), hidden_size)

    def predicts_response(self, offset: int) -> torch.Tensor:
        """[B, L] bool: position p + offset holds a response token."""
        target = torch.arange(self.features.shape[1], device=self.features.device)[None] + offset
        return (target >= self.prompt_lens[:, None]) & (target < self.lengths[:, None])

    def final(self, shift: int) -> torch.Tensor:
        """The target's final hidden at position p + shift for every row p: [B, L, H] (zero past the end)."""
        length, hidden = self.features.shape[1], self.hidden_size
        return F.pad(self.features[..., -hidden:], (0, 0, 0, shift))[:, shift : shift + length]


def soft_cross_entropy(rows: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], teacher_rows: torch.Tensor,
                       teacher_head: torch.Tensor, tv_weight: float = 0.0) -> torch.Tensor:
    """Per row -sum_v p(v) log q(v) (+ ``tv_weight`` * TV(p, q) = 1/2 sum_v |p(v) - q(v)|): rows [M, H],
    q = softmax(head(rows)); p = softmax(teacher_rows [M, Ht] @ teacher_head [V, Ht].T). Returns [M] float32;
    chunked, logits recomputed in backward. 1 - TV(p, q) is the chance a draft sampled from q is accepted."""
    def chunk(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            p = torch.softmax(F.linear(teacher, teacher_head).float(), dim=-1)
        log_q = torch.log_softmax(head(student).float(), dim=-1)
        loss = -(p * log_q).sum(-1)
        return loss + tv_weight * 0.5 * (p - log_q.exp()).abs().sum(-1) if tv_weight else loss

    parts = [checkpoint(chunk, rows[i : i + LOSS_CHUNK], teacher_rows[i : i + LOSS_CHUNK], use_reentrant=False)
             for i in range(0, rows.shape[0], LOSS_CHUNK)]
    return torch.cat(parts) if parts else rows.sum(-1)  # no rows: an empty loss that still has a graph


@torch.no_grad()
def overlap(student_logits: torch.Tensor, teacher_rows: torch.Tensor, teacher_head: torch.Tensor,
            draft_ids: Optional[torch.Tensor]) -> torch.Tensor:
    """sum_v min(p(v), q(v)) per row [M]: q = softmax(student_logits [M, Vd]), p = the target's full distribution
    softmax(teacher_rows [M, Ht] @ teacher_head [V, Ht].T) at the draft vocabulary's target ids ``draft_ids``
    [Vd] (None: all of V). A draft sampled from q is accepted with this probability (chunked)."""
    parts = []
    for i in range(0, student_logits.shape[0], LOSS_CHUNK):
        p = torch.softmax(F.linear(teacher_rows[i : i + LOSS_CHUNK], teacher_head).float(), dim=-1)
        p = p if draft_ids is None else p[:, draft_ids]
        q = torch.softmax(student_logits[i : i + LOSS_CHUNK].float(), dim=-1)
        parts.append(torch.minimum(p, q).sum(-1))
    return torch.cat(parts) if parts else student_logits.new_zeros(0)


@torch.no_grad()
def teacher_argmax(final: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """argmax of the full target logits for final-hidden rows [..., H] -> [...] int64 (chunked)."""
    flat = final.reshape(-1, final.shape[-1])
    out = [F.linear(flat[i : i + LOSS_CHUNK], weight).argmax(-1) for i in range(0, flat.shape[0], LOSS_CHUNK)]
    return torch.cat(out).view(final.shape[:-1])


class Task(ABC):
    """One drafter being trained: its module, loss, evaluation matches and artifact."""

    module: nn.Module
    #: target layers the task reads: the features hold their outputs first (then maybe more), final last
    feature_layers: tuple[int, ...]
    #: the target's full LM head [V, H] (evaluation: the target's argmax)
    teacher_full_weight: torch.Tensor
    #: extra padding tokens a batch needs past its longest sequence
    pad: int

    @abstractmethod
    def loss(self, batch: Batch) -> tuple[torch.Tensor, list[float]]:
        """(weighted total, per-step mean losses)."""

    @abstractmethod
    def matches(self, batch: Batch, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(match [B, L, k], valid [B, L, k]) of the k chain steps anchored at every row."""

    @abstractmethod
    def save(self, directory: Path) -> Path:
        """Write the loadable artifact."""

    def evaluation(self, batch: Batch, k: int) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(match, valid, probs): ``matches`` and, where the task estimates it, [B, L, k] the chance that chain
        step j anchored at each row, sampled from the draft at T=1, is accepted by the target at T=1
        (``overlap``, teacher-forced); None elsewhere."""
        return *self.matches(batch, k), None


class HeadTask(Task):
    """EAGLE-3 / MTP: the head unrolled for ``steps`` chain steps (training-time test), step j weighted
    ``step_weight ** j``; the teacher is the target renormalised over the head's draft vocabulary."""

    def __init__(self, head: FeatureHead, target: Transformer, *, steps: int, step_weight: float,
                 tv_weight: float = 0.0) -> None:
        self.module, self.head, self.target = head, head, target
        self.steps, self.step_weight, self.tv_weight = steps, step_weight, tv_weight
        self.feature_layers, self.pad = head.hidden_layers, steps + 1
        self.rope = RotaryTables(head.arch, dtype=torch.float32, device=target.device)
        self.teacher_weight = shared_head_rows(target, head.d2t).detach().float()
        self.teacher_full_weight = target.lm_head.weight.detach().float()

    def _head_input(self, batch: Batch) -> torch.Tensor:
        """The head's features: its layers (the first columns) or the target's final hidden (the last)."""
        if self.head.needs_final_hidden:
            return batch.features[..., -batch.hidden_size :]
        return batch.features[..., : len(self.head.hidden_layers) * batch.hidden_size]

    def loss(self, batch: Batch) -> tuple[torch.Tensor, list[float]]:
        outs = unroll_head(self.head, self.rope, self._head_input(batch), batch.tokens, self.steps)
        total, per_step = batch.features.new_zeros(()), []
        for step, out in enumerate(outs):
            mask = batch.predicts_response(2 + step)
            ce = soft_cross_entropy(out[mask], self.head.logits, batch.final(1 + step)[mask], self.teacher_weight,
                                    self.tv_weight).sum() / mask.sum().clamp_min(1)
            total = total + self.step_weight**step * ce
            per_step.append(float(ce.detach()))
        return total, per_step

    @torch.no_grad()
    def matches(self, batch: Batch, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._matches(batch, unroll_head(self.head, self.rope, self._head_input(batch), batch.tokens, k))

    @torch.no_grad()
    def evaluation(self, batch: Batch, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        outs = unroll_head(self.head, self.rope, self._head_input(batch), batch.tokens, k)  # once for both
        return *self._matches(batch, outs), self._acceptance_probs(batch, outs)

    def _matches(self, batch: Batch, outs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        k, length = len(outs), batch.features.shape[1]
        teacher = F.pad(batch.teacher_argmax, (0, k + 1), value=-1)
        drafts = [draft_to_target_ids(self.head.logits(out).argmax(-1), self.head.d2t) for out in outs]
        match = [draft == teacher[:, 1 + j : 1 + j + length] for j, draft in enumerate(drafts)]
        valid = [batch.predicts_response(2 + j) for j in range(k)]
        return torch.stack(match, -1), torch.stack(valid, -1)

    def _acceptance_probs(self, batch: Batch, outs: list[torch.Tensor]) -> torch.Tensor:
        k, vocab = len(outs), self.head.draft_vocab_size
        ids = None if self.head.d2t is None else draft_to_target_ids(torch.arange(vocab, device=self.head.d2t.device),
                                                                     self.head.d2t)
        probs = torch.zeros(*outs[0].shape[:2], k, device=outs[0].device)
        for j, out in enumerate(outs):
            mask = batch.predicts_response(2 + j)
            probs[..., j][mask] = overlap(self.head.logits(out[mask]), batch.final(1 + j)[mask],
                                          self.teacher_full_weight, ids)
        return probs

    def save(self, directory: Path) -> Path:
        if isinstance(self.head, Eagle3Head):
            return save_eagle3(self.head, directory)
        assert isinstance(self.head, MtpHead)
        return save_mtp(self.head, directory, target_num_layers=self.target.arch.num_layers)


class DraftModelTask(Task):
    """draft_target: a small causal LM distilled with KL to the target at every response position."""

    def __init__(self, model: Transformer, target: Transformer, tokenizer: Any = None) -> None:
        self.module, self.model, self.tokenizer = model, model, tokenizer
        self.feature_layers, self.pad = (), 1
        self.teacher_weight = self.teacher_full_weight = target.lm_head.weight.detach().float()

    def loss(self, batch: Batch) -> tuple[torch.Tensor, list[float]]:
        hidden = model_hidden(self.model, batch.tokens[:, : batch.features.shape[1]])
        mask = batch.predicts_response(1)
        ce = soft_cross_entropy(hidden[mask], self.model.lm_head, batch.final(0)[mask], self.teacher_weight).sum()
        ce = ce / mask.sum().clamp_min(1)
        return ce, [float(ce.detach())]

    @torch.no_grad()
    def matches(self, batch: Batch, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = model_hidden(self.model, batch.tokens[:, : batch.features.shape[1]])
        hit = F.pad(teacher_argmax(hidden, self.model.lm_head.weight) == batch.teacher_argmax, (0, k), value=False)
        length = hidden.shape[1]
        match = [hit[:, j : j + length] for j in range(k)]
        valid = [batch.predicts_response(1 + j) for j in range(k)]
        return torch.stack(match, -1), torch.stack(valid, -1)

    def save(self, directory: Path) -> Path:
        return save_draft_model(self.model, directory, self.tokenizer)


def chain_stats(match: torch.Tensor, valid: torch.Tensor) -> dict[str, Any]:
    """Acceptance statistics of greedy chains from per-anchor step matches [N, k] (anchors = rows whose
    first step is valid): top-1 agreement, mean acceptance length τ = 1 + leading matches (bonus
    token included), and the conditional acceptance of each step given all earlier ones."""
    anchors = valid[..., 0]
    hits = (match & valid)[anchors].float()
    if hits.numel() == 0:
        return {"anchors": 0, "top1": 0.0, "acceptance_length": 1.0, "conditional": []}
    leading = hits.cumprod(dim=-1)
    reached = torch.cat([torch.ones_like(leading[:, :1]), leading[:, :-1]], dim=-1).sum(0)
    return {
        "anchors": int(hits.shape[0]),
        "top1": float(hits[:, 0].mean()),
        "acceptance_length": float(1 + leading.sum(-1).mean()),
        "conditional": [float(a / r) if r > 0 else 0.0 for a, r in zip(leading.sum(0), reached)],
    }


def sampled_chain_length(probs: torch.Tensor, valid: torch.Tensor) -> float:
    """Expected acceptance length of T=1 chains from per-anchor step acceptance probabilities [N, k]
    (``Task.evaluation``; anchors = rows whose first step is valid): 1 + sum_j prod_{i<=j} probs_i."""
    anchors = valid[..., 0]
    if not anchors.any():
        return 1.0
    return float(1 + (probs * valid)[anchors].cumprod(dim=-1).sum(-1).mean())
