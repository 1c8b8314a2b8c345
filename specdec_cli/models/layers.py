"""Building blocks of a Llama-family decoder, reusable by drafters with their own caches.

Shapes: T = new tokens in the flattened ragged batch, H = hidden size, Hq/KV = query/KV
heads, D = head dim, L = keys visible to a request (cached prefix + its new tokens).

- ``RaggedBatch``: where each request's rows of the flat [T, ...] batch go in a slot cache,
  plus their RoPE cos/sin (built once per forward, shared by all layers).
- ``Attention`` / ``MLP`` / ``DecoderLayer`` / ``RMSNorm``: HF-named modules (q_proj, ...,
  input_layernorm) so HF state dicts load by name.

Drafters with their own caches call ``DecoderLayer`` with their own ``RaggedBatch`` and
buffers; those needing other attention patterns (e.g. DFlash: a non-causal block over injected
context K/V) combine ``Attention.project``, ``attention.attend`` and ``Attention.o_proj``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from specdec_cli.models.arch import ModelArch
from specdec_cli.models.attention import attend_batch, attend_requests
from specdec_cli.models.fast_linear import Linear, LinearGroup
from specdec_cli.models.norm import RMSNorm, row_kernel
from specdec_cli.models.rope import RotaryTables, apply_rotary


@dataclass(frozen=True)
class TreeRows:
    """One request's new rows as draft-tree nodes (tree verification): ``positions`` [n] their RoPE
    positions, ``visible`` [n, start + n] bool the slot keys each row may attend to (its cached prefix,
    its ancestors and itself). The rows are still written to cache positions start .. start + n - 1."""

    positions: list[int]
    visible: torch.Tensor

    @classmethod
    def from_parents(cls, start: int, parents: Sequence[int]) -> TreeRows:
        """Row i's parent is the earlier new row ``parents[i]`` (-1: none, a root at depth 0); every row
        sees the whole prefix of ``start`` keys, its ancestors and itself, at position start + depth."""
        n = len(parents)
        visible = torch.zeros(n, start + n, dtype=torch.bool)
        visible[:, :start] = True
        depths = []
        for i, parent in enumerate(parents):
            if not -1 <= parent < i:
                raise ValueError(f"tree row {i}: parent {parent} must be an earlier row or -1")
            if parent >= 0:
                visible[i] = visible[parent]
            visible[i, start + i] = True
            depths.append(0 if parent < 0 else depths[parent] + 1)
        return cls([start + depth for depth in depths], visible)


@dataclass
class RaggedBatch:
    """Placement of a ragged batch: request r owns rows ``offsets[r] : offsets[r] + counts[r]`` of
    the flat batch and writes them to cache slot ``slots[r]`` at positions ``starts[r] ...``.

    slot_ids / positions: [T] each row's slot and position (device tensors, for the K/V writes);
    cos/sin: [T, 1, D/2] RoPE tables for each row's position.
    block_bias: [R, n, L] causal limits when several requests bring the same number n of tokens
    in adjacent ascending slots on CPU (batch decode / verify): attention then runs as one
    batched call over the slot block; None otherwise (one call per request).
    visible: per request, None (causal) or its tree rows' key mask [n, start + n] (``TreeRows``).
    """

    slots: list[int]
    starts: list[int]
    counts: list[int]
    offsets: list[int]
    slot_ids: torch.Tensor
    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    block_bias: torch.Tensor | None = None
    visible: list[torch.Tensor | None] | None = None

    @classmethod
    def build(cls, slots: list[int], starts: list[int], counts: list[int], rope: RotaryTables,
              tree: Optional[Sequence[Optional[TreeRows]]] = None) -> RaggedBatch:
        """Positions ``starts[r] .. starts[r] + counts[r] - 1`` for each request; a request with
        ``tree[r]`` takes its RoPE positions and key mask from it (one attention call per request)."""
        offsets, total = [], 0
        for n in counts:
            offsets.append(total)
            total += n
        device = rope.cos.device
        positions = torch.tensor([p for s, n in zip(starts, counts) for p in range(s, s + n)], dtype=torch.int64,
                                 device=device)
        slot_ids = torch.tensor([s for s, n in zip(slots, counts) for _ in range(n)], dtype=torch.int64, device=device)
        if tree is not None and any(rows is not None for rows in tree):
            rope_positions = [p for s, n, rows in zip(starts, counts, tree)
                              for p in (range(s, s + n) if rows is None else rows.positions)]
            cos, sin = rope.lookup(torch.tensor(rope_positions, dtype=torch.int64, device=device))
            visible = [None if rows is None else rows.visible.to(device) for rows in tree]
            return cls(list(slots), list(starts), list(counts), offsets, slot_ids, positions, cos, sin,
                       visible=visible)
        cos, sin = rope.lookup(positions)
        batch = cls(list(slots), list(starts), list(counts), offsets, slot_ids, positions, cos, sin)
        adjacent = list(slots) == list(range(slots[0], slots[0] + len(slots)))
        if len(slots) > 1 and len(set(counts)) == 1 and adjacent and device.type == "cpu":
            batch.block_bias = _block_bias(starts, counts[0], dtype=rope.cos.dtype)
        return batch


def _block_bias(starts: list[int], n: int, *, dtype: torch.dtype) -> torch.Tensor:
    """[R, n, L] additive bias: query i of request r sees keys 0 .. starts[r] + i (L = longest request)."""
    cpu = torch.device("cpu")  # the batched block path runs on CPU only
    limits = torch.tensor(starts, device=cpu)[:, None] + torch.arange(n, device=cpu)[None, :]
    keys = torch.arange(max(starts) + n, device=cpu)
    return torch.zeros(len(starts), n, len(keys), dtype=dtype, device=cpu).masked_fill_(
        keys > limits[..., None], float("-inf"))


@dataclass
class DenseBatch:
    """B requests with n new tokens each, placed by device tensors alone (no host values, fixed shapes): the
    form a CUDA graph captures (engine/cuda_graphs.py). Attention reads each request's whole slot row.

    slot_ids / positions: [B*n] each row's slot and position; cos/sin: [B*n, 1, D/2]; slots: [B] cache rows
    read; bias: [B, n, L] additive causal limits over the slot (L = the cache's max_len)."""

    slot_ids: torch.Tensor
    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    bias: torch.Tensor

    @classmethod
    def build(cls, slots: torch.Tensor, starts: torch.Tensor, n: int, max_len: int, rope: RotaryTables) -> DenseBatch:
        """slots [B], starts [B] (the first new token's position) on the model's device."""
        positions = starts[:, None] + torch.arange(n, device=starts.device)  # [B, n]
        cos, sin = rope.lookup(positions.reshape(-1))
        keys = torch.arange(max_len, device=starts.device)
        bias = torch.zeros(*positions.shape, max_len, dtype=rope.cos.dtype, device=starts.device).masked_fill_(
            keys > positions[..., None], float("-inf"))
        return cls(slots.repeat_interleave(n), positions.reshape(-1), cos, sin, slots, bias)


class Attention(nn.Module):
    """GQA self-attention with RoPE, optional q/k RMSNorm (Qwen3) and q/k/v/o biases."""

    def __init__(self, arch: ModelArch, *, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        hq, hkv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
        kw = dict(dtype=dtype, device=device)
        self.num_heads, self.num_kv_heads, self.head_dim = arch.num_heads, arch.num_kv_heads, arch.head_dim
        self.scale = arch.head_dim**-0.5
        self.q_proj = Linear(arch.hidden_size, hq, arch.attention_bias, **kw)
        self.k_proj = Linear(arch.hidden_size, hkv, arch.attention_bias, **kw)
        self.v_proj = Linear(arch.hidden_size, hkv, arch.attention_bias, **kw)
        self.o_proj = Linear(hq, arch.hidden_size, arch.o_proj_bias, **kw)
        self.q_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps, **kw) if arch.qk_norm else None
        self.k_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps, **kw) if arch.qk_norm else None
        self.qkv = LinearGroup(self.q_proj, self.k_proj, self.v_proj)

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, H] -> q [T, Hq, D], k [T, KV, D] (normed if Qwen3, not yet rotated), v [T, KV, D]."""
        t = x.shape[0]
        q, k, v = self.qkv(x)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, H] -> q [T, Hq, D], k [T, KV, D] (normed if Qwen3, then rotated), v [T, KV, D]."""
        q, k, v = self._heads(x)
        # one rotation over the q and k heads together: the same elementwise ops, half the operator calls
        q, k = apply_rotary(torch.cat((q, k), dim=1), cos, sin).split([self.num_heads, self.num_kv_heads], dim=1)
        return q, k, v

    def _project_and_store(self, x: torch.Tensor, batch: RaggedBatch | DenseBatch, k_cache: torch.Tensor,
                           v_cache: torch.Tensor, kernel) -> torch.Tensor:
        """x [T, H] -> rotated q [T, Hq, D]; the rows' rotated k and their v go to (slot, position) of the caches.
        With ``kernel`` (``row_ops``): one ``rope_store`` call (bit for bit the torch path's result)."""
        if kernel is not None:
            return kernel.rope_store(*self._heads(x), batch.cos, batch.sin, k_cache, v_cache, batch.slot_ids,
                                     batch.positions)
        q, k, v = self.project(x, batch.cos, batch.sin)
        # one scatter per buffer: [slots, max_len, KV, D] views, indexed by (slot, position) per row
        k_cache.transpose(1, 2)[batch.slot_ids, batch.positions] = k
        v_cache.transpose(1, 2)[batch.slot_ids, batch.positions] = v
        return q

    def forward(
        self, x: torch.Tensor, batch: RaggedBatch | DenseBatch, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """x [T, H] -> [T, H]; writes each request's new K/V into its slot of k_cache/v_cache
        ([slots, KV, max_len, D]) and attends causally over the slot's prefix plus them: per request
        (``attend_requests``: on CPU the row kernel for decodes and verifies), or in one batched call for a
        dense batch or ``batch.block_bias`` where the row kernel does not apply."""
        rows = row_kernel(x, k_cache)  # CPU float32 without autograd: the compiled row ops, decided once per layer
        q = self._project_and_store(x, batch, k_cache, v_cache, rows)
        if isinstance(batch, DenseBatch):
            count, n = batch.bias.shape[:2]
            if rows is None or n > rows.ATTEND_MAX_ROWS:
                out = attend_batch(q.view(count, n, self.num_heads, self.head_dim),
                                   k_cache.index_select(0, batch.slots), v_cache.index_select(0, batch.slots),
                                   scale=self.scale, bias=batch.bias)
                return self.o_proj(out.reshape(x.shape[0], -1))
            starts = batch.positions.view(count, n)[:, 0].tolist()
            placement = (batch.slots.tolist(), starts, [n] * count, [None] * count)
        elif batch.block_bias is not None and (rows is None or batch.counts[0] > rows.ATTEND_MAX_ROWS):
            first, count, (n, seq) = batch.slots[0], len(batch.slots), batch.block_bias.shape[1:]
            out = attend_batch(
                q.view(count, n, self.num_heads, self.head_dim),
                k_cache[first : first + count, :, :seq],
                v_cache[first : first + count, :, :seq],
                scale=self.scale,
                bias=batch.block_bias,
            )
            return self.o_proj(out.reshape(x.shape[0], -1))
        else:
            placement = (batch.slots, batch.starts, batch.counts, batch.visible or [None] * len(batch.slots))
        out = attend_requests(q, k_cache, v_cache, *placement, scale=self.scale, kernel=rows)
        return self.o_proj(out.view(x.shape[0], -1))


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, arch: ModelArch, *, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.gate_proj = Linear(arch.hidden_size, arch.intermediate_size, arch.mlp_bias, **kw)
        self.up_proj = Linear(arch.hidden_size, arch.intermediate_size, arch.mlp_bias, **kw)
        self.down_proj = Linear(arch.intermediate_size, arch.hidden_size, arch.mlp_bias, **kw)
        self.gate_up = LinearGroup(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm block: h = x + attn(norm(x)); out = h + mlp(norm(h))."""

    def __init__(self, arch: ModelArch, *, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, **kw)
        self.self_attn = Attention(arch, **kw)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, **kw)
        self.mlp = MLP(arch, **kw)

    def forward(
        self, x: torch.Tensor, batch: RaggedBatch | DenseBatch, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """x [T, H] -> [T, H] (the residual stream after this layer)."""
        h, normed = self.post_attention_layernorm.residual(
            x, self.self_attn(self.input_layernorm(x), batch, k_cache, v_cache))
        return h + self.mlp(normed)
