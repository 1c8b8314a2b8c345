"""The target transformer: a Llama-family decoder over a ragged batch with a slot KV cache.

One ``forward`` call mixes prefill chunks, 1-token decodes and K+1-token verifies: request r
appends ``num_new[r]`` tokens to cache slot ``slots[r]`` at positions ``cache.length(slot) ...``
(RoPE positions = cache positions) and the slot's length grows by that much. Linear layers run
on the flattened [T, H] batch; attention runs per request over its slot (one batched call when
all requests bring the same number of tokens in adjacent slots, e.g. batch decode / verify).
By default (``row_invariant``) a token's logits are bitwise independent of the batch shape.

Layer ids: ``hidden_layers=(i, ...)`` captures the OUTPUT of decoder layer i (0-based), the
un-normalised residual stream = HF ``hidden_states[i + 1]`` (see ``arch`` for conversions).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, Sequence

import torch
from torch import nn

from specdec_cli.models.arch import ModelArch
from specdec_cli.models.errors import CacheOverflowError
from specdec_cli.models.fast_linear import Linear
from specdec_cli.models.kv_cache import KVCache
from specdec_cli.models.layers import DecoderLayer, DenseBatch, RaggedBatch, RMSNorm, TreeRows
from specdec_cli.models.rope import RotaryTables

LogitsFor = Literal["all", "last"] | list[int]


@dataclass
class ForwardOutput:
    """logits: float32 [rows, V] (rows chosen by ``logits_for``); hidden: layer id -> [T, H];
    final_hidden: post-final-norm hidden [T, H] when requested."""

    logits: torch.Tensor
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    final_hidden: torch.Tensor | None = None


class Transformer(nn.Module):
    """Decoder-only LM with HF Llama parameter names (minus the ``model.`` prefix).

    Parameters start uninitialised; ``load_model`` (or ``load_state_dict``) fills them.
    """

    def __init__(
        self, arch: ModelArch, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> None:
        super().__init__()
        self.arch = arch
        kw = dict(dtype=dtype, device=device)
        weight = torch.empty(arch.vocab_size, arch.hidden_size, **kw)
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(DecoderLayer(arch, **kw) for _ in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, **kw)
        self.lm_head = Linear(arch.hidden_size, arch.vocab_size, **kw)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryTables(arch, dtype=dtype, device=device)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def row_invariant(self) -> bool:
        """Whether a token's logits are bitwise independent of the batch shape (see ``fast_linear``).

        On (default): single-token forwards pad their GEMMs so that decode == verify exactly.
        Off: single-token forwards use the GEMV kernel (faster decode; fp32-rounding differences).
        """
        return self.lm_head.row_invariant

    @row_invariant.setter
    def row_invariant(self, enabled: bool) -> None:
        for module in self.modules():
            if isinstance(module, Linear):
                module.row_invariant = enabled

    def new_cache(self, num_slots: int, max_len: int) -> KVCache:
        """A KV cache for this model's layers: ``num_slots`` requests of up to ``max_len`` tokens."""
        window = self.arch.sliding_window
        if window is not None and max_len > window:
            raise CacheOverflowError(
                f"sliding-window attention is not implemented: max_len={max_len} must be <= sliding_window={window}"
            )
        self.rope.ensure(max_len)
        return KVCache(
            num_layers=len(self.layers),
            num_kv_heads=self.arch.num_kv_heads,
            head_dim=self.arch.head_dim,
            num_slots=num_slots,
            max_len=max_len,
            dtype=self.dtype,
            device=self.device,
        )

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Build the lazily made per-weight state (packed weights, the few-row kernel) with a throw-away 2-token
        and 1-token forward, so that the first timed request does not pay for it."""
        cache = self.new_cache(1, 3)
        self(cache, [0], torch.zeros(2, dtype=torch.long, device=self.device), logits_for="last")
        self(cache, [0], torch.zeros(1, dtype=torch.long, device=self.device), logits_for="last")

    def truncated(self, num_layers: int) -> Transformer:
        """First ``num_layers`` layers + final norm + LM head, sharing weights (self-speculative draft)."""
        if not 1 <= num_layers <= self.arch.num_layers:
            raise ValueError(f"num_layers must be in 1..{self.arch.num_layers}, got {num_layers}")
        sub = Transformer.__new__(Transformer)
        nn.Module.__init__(sub)
        sub.arch = dataclasses.replace(self.arch, num_layers=num_layers)
        sub.embed_tokens, sub.norm, sub.lm_head, sub.rope = self.embed_tokens, self.norm, self.lm_head, self.rope
        sub.layers = nn.ModuleList(self.layers[:num_layers])
        return sub

    def forward(
        self,
        cache: KVCache,
        slots: Sequence[int],
        token_ids: Sequence[torch.Tensor] | torch.Tensor,
        num_new: Sequence[int] | None = None,
        *,
        logits_for: LogitsFor = "all",
        hidden_layers: Sequence[int] = (),
        final_hidden: bool = False,
        tree_parents: Sequence[Sequence[int] | None] | None = None,
    ) -> ForwardOutput:
        """Append new tokens to each request's slot and return their logits / hidden states.

        token_ids: a list of 1-D int tensors (one per request) or a flat [T] tensor with
        ``num_new`` (may be omitted for a single request). logits_for: "all" -> [T, V];
        "last" -> [R, V]; list n_r -> the last n_r tokens of each request, concatenated.
        tree_parents[r] (tree verification): the parent of each new token among request r's new tokens
        (-1: none), each token attending to the cached prefix, its ancestors and itself at RoPE position
        start + depth (``TreeRows``); None (default, or per request): causal.
        On any error (overflow, bad ids) no slot length changes.
        """
        ids, counts = _flatten(token_ids, num_new, len(slots))
        self._validate(cache, slots, counts, hidden_layers)
        self.rope.ensure(cache.max_len)
        starts = [cache.length(s) for s in slots]
        tree = None if tree_parents is None else [
            None if parents is None else TreeRows.from_parents(start, parents)
            for start, parents in zip(starts, tree_parents)]
        batch = RaggedBatch.build(list(slots), starts, counts, self.rope, tree)
        rows = _logit_rows(logits_for, batch)
        wanted = set(hidden_layers)
        hidden: dict[int, torch.Tensor] = {}
        x = self.embed_tokens(ids.to(self.device))
        for index, layer in enumerate(self.layers):
            x = layer(x, batch, *cache.layer(index))
            if index in wanted:
                hidden[index] = x
        for slot, n in zip(slots, counts):
            cache.advance(slot, n)
        normed = self.norm(x) if final_hidden or rows is None else None
        if rows is None:
            head_in = normed
        elif normed is not None:
            head_in = normed[rows]
        else:
            head_in = self.norm(x[rows])
        logits = self.lm_head(head_in).float()
        return ForwardOutput(logits=logits, hidden=hidden, final_hidden=normed if final_hidden else None)

    def forward_dense(self, cache: KVCache, slots: torch.Tensor, starts: torch.Tensor, token_ids: torch.Tensor, *,
                      hidden_layers: Sequence[int] = (), final_hidden: bool = False) -> ForwardOutput:
        """``forward`` for B requests with n new tokens each, from device tensors alone (``DenseBatch``: what a
        CUDA graph replays): slots [B], starts [B] (each slot's length), token_ids [B, n] -> logits [B*n, V].
        Writes the K/V but leaves the slot lengths to the caller (``cache.advance``); the caller checks fit."""
        count, n = token_ids.shape
        batch = DenseBatch.build(slots, starts, n, cache.max_len, self.rope)
        x = self.embed_tokens(token_ids.reshape(-1))
        hidden: dict[int, torch.Tensor] = {}
        for index, layer in enumerate(self.layers):
            x = layer(x, batch, *cache.layer(index))
            if index in hidden_layers:
                hidden[index] = x
        normed = self.norm(x)
        return ForwardOutput(logits=self.lm_head(normed).float(), hidden=hidden,
                             final_hidden=normed if final_hidden else None)

    def _validate(self, cache: KVCache, slots: Sequence[int], counts: list[int], hidden_layers: Sequence[int]) -> None:
        if cache.num_layers != len(self.layers):
            raise ValueError(f"cache has {cache.num_layers} layers, model has {len(self.layers)}")
        if not slots:
            raise ValueError("a forward needs at least one request")
        if len(set(slots)) != len(slots):
            raise ValueError(f"duplicate slots in one forward: {list(slots)}")
        if any(n < 1 for n in counts):
            raise ValueError(f"every request needs at least one new token, got num_new={counts}")
        bad = [i for i in hidden_layers if not 0 <= i < len(self.layers)]
        if bad:
            raise ValueError(f"hidden_layers {bad} out of range 0..{len(self.layers) - 1} (output-of-layer ids)")
        for slot, n in zip(slots, counts):
            cache.check_fits(slot, n)


def _flatten(
    token_ids: Sequence[torch.Tensor] | torch.Tensor, num_new: Sequence[int] | None, num_requests: int
) -> tuple[torch.Tensor, list[int]]:
    """Normalise the two input forms to (flat ids [T] int64, counts [R])."""
    if isinstance(token_ids, torch.Tensor):
        ids = token_ids.reshape(-1)
        if num_new is None:
            if num_requests != 1:
                raise ValueError("a flat token_ids tensor for several requests needs num_new")
            num_new = [ids.numel()]
    else:
        if num_new is not None and list(num_new) != [t.numel() for t in token_ids]:
            raise ValueError("num_new disagrees with the lengths of the token_ids list")
        num_new = [t.numel() for t in token_ids]
        ids = torch.cat([t.reshape(-1) for t in token_ids]) if token_ids else torch.empty(0, dtype=torch.int64)
    counts = [int(n) for n in num_new]
    if len(counts) != num_requests:
        raise ValueError(f"{num_requests} slots but {len(counts)} token groups")
    if sum(counts) != ids.numel():
        raise ValueError(f"num_new sums to {sum(counts)} but {ids.numel()} token ids were given")
    return ids.long(), counts


def _logit_rows(logits_for: LogitsFor, batch: RaggedBatch) -> torch.Tensor | None:
    """Row indices of the flat batch that need logits; None means all rows."""
    if logits_for == "all":
        return None
    ends = [off + n for off, n in zip(batch.offsets, batch.counts)]
    if logits_for == "last":
        rows = [end - 1 for end in ends]
    elif isinstance(logits_for, (list, tuple)):
        if len(logits_for) != len(ends) or any(not 0 <= k <= n for k, n in zip(logits_for, batch.counts)):
            raise ValueError(f"logits_for={logits_for} must give 0..num_new[r] tokens for each request")
        rows = [row for end, k in zip(ends, logits_for) for row in range(end - k, end)]
    else:
        raise ValueError(f"logits_for must be 'all', 'last' or a list of ints, got {logits_for!r}")
    return torch.tensor(rows, dtype=torch.int64, device=batch.cos.device)
