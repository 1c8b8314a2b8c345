"""The DFlash drafter: per slot, a cache of context K/V; one non-causal block forward per ``propose``.

One forward over the block [anchor, mask x (B-1)] gives ``min(k, B - 1)`` drafts, each drawn independently
from its filtered distribution (q = exactly that distribution; ``draft_policy=argmax``: one-hot). The
network and its checkpoint format are in ``dflash``.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.nn.functional as F

from specdec_cli.config.schema import DflashMethodConfig
from specdec_cli.drafters.base import (DRAFTERS, Drafter, DrafterDeps, DraftRequest, Proposal, block_stop,
                                       drafting_params, draw_block)
from specdec_cli.drafters.dflash import DFlashDraft, load_dflash
from specdec_cli.drafters.learned import load_head, shipped_checkpoint
from specdec_cli.models import KVCache, Transformer
from specdec_cli.sampling.params import BatchParams

log = logging.getLogger(__name__)


class DFlashDrafter(Drafter):
    """Block-form drafter: per slot, a cache of context K/V for the committed tokens before the anchor."""

    has_proposal_distribution = True

    def __init__(self, draft: DFlashDraft, target: Transformer, *, num_slots: int, max_seq_len: int,
                 policy: str) -> None:
        self.draft = draft.requires_grad_(False).eval()
        self.target, self.policy = target, policy
        self.hidden_layers = draft.target_layers
        self.draft_vocab_size = draft.head_weight.shape[0]
        arch, weight = draft.arch, draft.head_weight
        self.cache = KVCache(num_layers=arch.num_layers, num_kv_heads=arch.num_kv_heads, head_dim=arch.head_dim,
                             num_slots=num_slots, max_len=max_seq_len, dtype=weight.dtype, device=weight.device)
        draft.rope.ensure(max_seq_len + draft.block_size)  # outside inference mode: the tables stay usable
        self._warned = False

    def add_request(self, slot: int, prompt_ids: list[int]) -> None:
        self.cache.rewind(slot, 0)

    def remove_request(self, slot: int, token_ids: list[int]) -> None:
        self.cache.rewind(slot, 0)

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], k: int, params: BatchParams) -> Proposal:
        self._catch_up(requests)
        draft, device = self.draft, self.draft.head_weight.device
        num, size = min(k, draft.block_size - 1), draft.block_size
        anchors = torch.tensor([len(r.token_ids) - 1 for r in requests], device=device)
        block = torch.full((len(requests), size), draft.mask_token_id, dtype=torch.int64, device=device)
        block[:, 0] = torch.tensor([r.token_ids[-1] for r in requests], device=device)
        length = self.cache.max_len  # not the batch's longest: attention over a batch-independent length
        slots = torch.tensor([r.slot for r in requests], device=device)
        context = [(k_c[slots, :, :length], v_c[slots, :, :length])
                   for k_c, v_c in (self.cache.layer(i) for i in range(self.cache.num_layers))]
        sees_context = torch.arange(length, device=device)[None, None, :] < anchors[:, None, None]
        mask = torch.cat([sees_context.expand(-1, size, -1),
                          torch.ones(len(requests), size, size, dtype=torch.bool, device=device)], dim=-1)
        hidden = draft.decode(block, anchors[:, None] + torch.arange(size, device=device), context, mask)
        logits, params = draft.logits(hidden[:, 1 : num + 1]).float(), drafting_params(params, self.policy)
        tokens, probs = draw_block(logits, params)
        return Proposal(tokens=F.pad(tokens, (0, k - num)), draft_probs=F.pad(probs, (0, 0, 0, k - num)),
                        num_drafts=block_stop(logits, tokens, probs, params, self.draft_confidence))

    def _catch_up(self, requests: list[DraftRequest]) -> None:
        """Append the context K/V of each slot's committed tokens before its anchor (positions
        ``cache.length(slot) .. len(token_ids) - 2``), from the request's target features, recomputed
        with the target when it brought too few (e.g. a request drafted without an engine)."""
        spans = [(r, self.cache.length(r.slot), len(r.token_ids) - 1) for r in requests]
        spans = [span for span in spans if span[2] > span[1]]
        if not spans:
            return
        rows = [self._given(r, end - start) for r, start, end in spans]
        missing = [i for i, row in enumerate(rows) if row is None]
        if missing:
            for i, row in zip(missing, self._recompute([spans[i] for i in missing])):
                rows[i] = row
        weight = self.draft.head_weight
        context = self.draft.fuse(torch.cat(rows).to(device=weight.device, dtype=weight.dtype))
        positions = torch.cat([torch.arange(start, end, device=weight.device) for _, start, end in spans])
        slot_ids = torch.cat([torch.full((end - start,), r.slot, device=weight.device) for r, start, end in spans])
        for index, (keys, values) in enumerate(self.draft.context_kv(context, positions)):
            k_cache, v_cache = self.cache.layer(index)
            k_cache.transpose(1, 2)[slot_ids, positions] = keys
            v_cache.transpose(1, 2)[slot_ids, positions] = values
        for r, start, end in spans:
            self.cache.advance(r.slot, end - start)

    def _given(self, request: DraftRequest, needed: int) -> Optional[torch.Tensor]:
        """The last ``needed`` feature rows [needed, n*Ht] the request brought, or None if too few."""
        hidden = request.target_hidden
        if any(layer not in hidden or hidden[layer].shape[0] < needed for layer in self.hidden_layers):
            return None
        return torch.cat([hidden[layer][-needed:] for layer in self.hidden_layers], dim=-1)

    def _recompute(self, spans: list[tuple[DraftRequest, int, int]]) -> list[torch.Tensor]:
        """Target features of positions start..end-1 for (request, start, end) spans (slow path)."""
        if not self._warned:
            log.warning("target features missing for a DFlash draft request; recomputing them with the target")
            self._warned = True
        prefixes = [torch.tensor(r.token_ids[:end], dtype=torch.int64) for r, _, end in spans]
        cache = self.target.new_cache(len(prefixes), max(p.numel() for p in prefixes))
        output = self.target(cache, list(range(len(prefixes))), prefixes, logits_for=[0] * len(prefixes),
                             hidden_layers=self.hidden_layers)
        features = torch.cat([output.hidden[layer] for layer in self.hidden_layers], dim=-1)
        offsets = [0, *torch.tensor([p.numel() for p in prefixes]).cumsum(0).tolist()]
        return [features[off + start : off + end] for off, (_, start, end) in zip(offsets, spans)]


@DRAFTERS.register("dflash")
def build_dflash(cfg: DflashMethodConfig, deps: DrafterDeps) -> Drafter:
    path = cfg.checkpoint or shipped_checkpoint("dflash", "checkpoint")
    draft = load_head(load_dflash, path, cfg.head_dtype, deps, target_layers=cfg.target_layers)
    if cfg.num_draft_tokens > draft.block_size - 1:  # the schedule's lengths never exceed it (validated)
        log.warning("this DFlash draft has block_size %d: it proposes at most %d tokens per step, not %d",
                    draft.block_size, draft.block_size - 1, cfg.num_draft_tokens)
    return DFlashDrafter(draft, deps.target, num_slots=deps.num_slots, max_seq_len=deps.max_seq_len,
                         policy=cfg.draft_policy)
