"""Feature heads (EAGLE-3, MTP) and the step-form drafter that runs them.

- ``HeadLayer`` / ``FeatureHead``: a draft head (one layer, or a few) conditioned on target features.
- ``FeatureDrafter``: the step-form drafter around a ``FeatureHead`` with its own slot KV cache.

Pairing: the head row at position p reads the target feature of position p and the embedding of
token p+1, and predicts token p+2. The target's features of the newest committed token are unknown
until the next verify, so after catching up a slot's head cache holds exactly ``len(tokens) - 1``
entries computed from real target features; the rows a chain adds from the head's own hidden states
are overwritten by the next catch-up.
"""
from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Callable, Optional

import torch
from torch import nn

from specdec_cli.drafters.base import ChainStop, Drafter, DraftRequest, Proposal, draw, drafting_params
from specdec_cli.models import KVCache, ModelArch, Transformer
from specdec_cli.models.fast_linear import Linear, LinearGroup
from specdec_cli.models.layers import MLP, Attention, RaggedBatch, RMSNorm
from specdec_cli.models.rope import RotaryTables
from specdec_cli.sampling import draft_to_target_ids
from specdec_cli.sampling.params import BatchParams

log = logging.getLogger(__name__)

#: attend(self_attn, x [T, A]) -> [T, H]: one layer's attention sub-block including o_proj.
LayerAttentionFn = Callable[[Attention, torch.Tensor], torch.Tensor]
#: attention(layer, self_attn, x [T, A]) -> [T, H]: the same for head layer ``layer`` (its own K/V).
AttentionFn = Callable[[int, Attention, torch.Tensor], torch.Tensor]


class HeadLayer(nn.Module):
    """A Llama decoder layer whose attention reads ``attn_in_size`` features (EAGLE-3: [emb; hidden], 2H).

    ``block(attn_in [T, A], residual [T, H], attend) -> [T, H]``: h = residual + attend(attn_in);
    out = h + mlp(post_attention_layernorm(h)). ``attend`` is this layer's slot-cache attention at
    inference and its training-time-test attention in ``specdec_cli.train``.
    """

    def __init__(self, arch: ModelArch, attn_in_size: int, *, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, **kw)
        self.self_attn = Attention(arch, **kw)
        if attn_in_size != arch.hidden_size:
            attn = self.self_attn
            for name in ("q_proj", "k_proj", "v_proj"):
                old = getattr(attn, name)
                setattr(attn, name, Linear(attn_in_size, old.out_features, old.bias is not None, **kw))
            attn.qkv = LinearGroup(attn.q_proj, attn.k_proj, attn.v_proj)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, **kw)
        self.mlp = MLP(arch, **kw)

    def block(self, attn_in: torch.Tensor, residual: torch.Tensor, attend: LayerAttentionFn) -> torch.Tensor:
        h, normed = self.post_attention_layernorm.residual(residual, attend(self.self_attn, attn_in))
        return h + self.mlp(normed)


class FeatureHead(nn.Module, ABC):
    """A draft head on target features. Subclasses set the attributes below in ``__init__``.

    ``fuse(features [T, F]) -> [T, H]``: target features (the ``hidden_layers`` outputs, then the
    final hidden if ``needs_final_hidden``, concatenated) to the head's hidden input.
    ``forward(hidden [T, H], token_ids [T], attention) -> out [T, H]``: one head step per row, through
    ``num_layers`` layers (layer i attends with ``attention(i, ...)``).
    ``recycle(out) -> [T, H]``: the hidden fed to the next chain step; ``logits(out) -> [T, Vd]``.
    The token embedding ``embed_weight`` [V, H] is a non-persistent buffer (the target's, frozen).
    """

    arch: ModelArch
    num_layers: int = 1
    hidden_layers: tuple[int, ...]
    needs_final_hidden: bool
    draft_vocab_size: int
    d2t: Optional[torch.Tensor]
    embed_weight: torch.Tensor

    @abstractmethod
    def fuse(self, features: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def forward(self, hidden: torch.Tensor, token_ids: torch.Tensor, attention: AttentionFn) -> torch.Tensor: ...

    @abstractmethod
    def recycle(self, out: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def logits(self, out: torch.Tensor) -> torch.Tensor: ...


def target_features(hidden: dict[int, torch.Tensor], final: Optional[torch.Tensor], head: FeatureHead) -> torch.Tensor:
    """The head's feature rows [T, F] from target outputs (layer id -> [T, H], final [T, H])."""
    parts = [hidden[layer] for layer in head.hidden_layers]
    if head.needs_final_hidden:
        parts.append(final)
    return torch.cat(parts, dim=-1)


# --------------------------------------------------------------------------- the drafter
class FeatureDrafter(Drafter):
    """Step-form drafter around a ``FeatureHead``: catch up on new target features, then K chain steps.

    Per slot, ``committed[slot]`` head-cache entries come from real target features. Each ``propose``
    rewinds the slot there, feeds the features of the tokens committed since (recomputing them with the
    target when the request carries none, e.g. a drafter attached mid-request), then chains on its own
    hidden states, drawing each token with ``draw`` (the request's filters and generator; ``draft_policy=argmax``:
    temperature 0, one-hot q in draft ids). Draft ids are mapped to target ids once (d2t); q stays in
    the draft vocabulary.
    """

    has_proposal_distribution = True

    def __init__(self, head: FeatureHead, target: Transformer, *, num_slots: int, max_seq_len: int,
                 policy: str) -> None:
        self.head = head.requires_grad_(False).eval()
        self.target = target
        self.policy = policy
        self.draft_vocab_size, self.d2t = head.draft_vocab_size, head.d2t
        self.hidden_layers, self.needs_final_hidden = head.hidden_layers, head.needs_final_hidden
        arch, device = head.arch, head.embed_weight.device
        self.rope = RotaryTables(arch, dtype=head.embed_weight.dtype, device=device)
        self.rope.ensure(max_seq_len)
        self.cache = KVCache(num_layers=head.num_layers, num_kv_heads=arch.num_kv_heads, head_dim=arch.head_dim,
                             num_slots=num_slots, max_len=max_seq_len, dtype=head.embed_weight.dtype, device=device)
        self.committed = [0] * num_slots
        self.recomputed = 0  # requests whose target features had to be recomputed (the slow path)

    def add_request(self, slot: int, prompt_ids: list[int]) -> None:
        self.cache.rewind(slot, 0)
        self.committed[slot] = 0

    def remove_request(self, slot: int, token_ids: list[int]) -> None:
        self.add_request(slot, [])

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], k: int, params: BatchParams) -> Proposal:
        slots = [r.slot for r in requests]
        features, tokens, counts = self._catch_up(requests)
        device = self.head.embed_weight.device
        out = self._step(self.head.fuse(features), tokens.to(device), slots, counts)
        if len(counts) == 1:  # batch 1: the last row, a view
            out = out[-1:]
        else:
            out = out[torch.tensor(counts, device=device).cumsum(0) - 1]
        params = drafting_params(params, self.policy)
        drafted = torch.zeros(len(requests), k, dtype=torch.int64, device=device)
        draft_probs = torch.zeros(len(requests), k, self.draft_vocab_size, device=device)
        chain = ChainStop(len(requests), self.draft_confidence)
        for step in range(k):
            rows, row_params = chain.rows, chain.params(params)
            logits = self.head.logits(out).float()
            draft_ids, probs = draw(logits, row_params)
            drafted[rows, step], draft_probs[rows, step] = draft_to_target_ids(draft_ids, self.d2t), probs
            keep = chain.record(logits, draft_ids, probs, row_params)
            if not chain.rows:
                break
            if step + 1 < k:
                out = self._step(self.head.recycle(out[keep]), drafted[chain.rows, step].to(device),
                                 [slots[r] for r in chain.rows], [1] * len(chain.rows))
        return Proposal(tokens=drafted, draft_probs=draft_probs, num_drafts=chain.lengths)

    def _step(self, hidden: torch.Tensor, token_ids: torch.Tensor, slots: list[int], counts: list[int]) -> torch.Tensor:
        """Append ``counts[r]`` rows to each slot's head cache; returns the head outputs [T, H]."""
        batch = RaggedBatch.build(slots, [self.cache.length(s) for s in slots], counts, self.rope)
        out = self.head(hidden, token_ids, self.cache_attention(batch))
        for slot, n in zip(slots, counts):
            self.cache.advance(slot, n)
        return out

    def cache_attention(self, batch: RaggedBatch) -> AttentionFn:
        """Head layer i attends over (and appends to) its own K/V of the slot cache."""
        return lambda layer, attn, x: attn(x, batch, *self.cache.layer(layer))

    def _catch_up(self, requests: list[DraftRequest]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Rewind each slot to its last real-feature entry (at least one row is re-fed) and gather the
        rows to feed: features [T, F] of positions start..n-2 and the tokens start+1..n-1 [T]."""
        rows: list[Optional[torch.Tensor]] = []
        starts = []
        for req in requests:
            end = len(req.token_ids) - 1
            start = min(self.committed[req.slot], end - 1)
            needed = end - start
            starts.append(start)
            rows.append(target_features(req.target_hidden, req.target_final_hidden, self.head)[-needed:]
                        if self._num_features(req) >= needed else None)
        missing = [i for i, row in enumerate(rows) if row is None]
        if missing:
            fresh = self._recompute([requests[i] for i in missing], [starts[i] for i in missing])
            for i, row in zip(missing, fresh):
                rows[i] = row
        tokens, counts = [], []
        for req, start in zip(requests, starts):
            end = len(req.token_ids) - 1
            self.cache.rewind(req.slot, start)
            self.committed[req.slot] = end
            tokens.extend(req.token_ids[start + 1 : end + 1])
            counts.append(end - start)
        device = self.head.embed_weight.device
        features = torch.cat([row.to(device=device, dtype=self.head.embed_weight.dtype) for row in rows])
        return features, torch.tensor(tokens, dtype=torch.int64, device=device), counts

    def _num_features(self, request: DraftRequest) -> int:
        """How many trailing committed positions the request brought target features for."""
        if self.hidden_layers:
            known = request.target_hidden.get(self.hidden_layers[0])
        else:
            known = request.target_final_hidden
        return 0 if known is None else known.shape[0]

    def _recompute(self, requests: list[DraftRequest], starts: list[int]) -> list[torch.Tensor]:
        """Target features of positions start..n-2 for requests that did not bring them (slow path)."""
        if not self.recomputed:
            log.warning("target features missing for a draft request; recomputing them with the target")
        self.recomputed += len(requests)
        prefixes = [torch.tensor(r.token_ids[:-1], dtype=torch.int64) for r in requests]
        cache = self.target.new_cache(len(requests), max(p.numel() for p in prefixes))
        output = self.target(cache, list(range(len(requests))), prefixes, logits_for=[0] * len(requests),
                             hidden_layers=self.hidden_layers, final_hidden=self.needs_final_hidden)
        features = target_features(output.hidden, output.final_hidden, self.head)
        bounds = torch.tensor([p.numel() for p in prefixes]).cumsum(0).tolist()
        return [features[end - p.numel() + start : end] for p, start, end in zip(prefixes, starts, bounds)]
