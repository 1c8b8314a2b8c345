"""Slot KV cache: one preallocated buffer per layer, one row (slot) per live request.

Layout per layer: ``k[layer]``, ``v[layer]`` = [num_slots, num_kv_heads, max_len, head_dim].
Slot ``s`` holds ``length(s)`` committed entries at positions ``0 .. length(s)-1``; entries
past the length are never read, so ``rewind`` only moves the host-side length (no device work,
no sync) and a slot rewound to 0 for its next owner cannot see its previous owner's keys.
Lengths live on the host: the model reads them to place new tokens without a device sync.
"""
from __future__ import annotations

import torch

from specdec_cli.models.errors import CacheOverflowError


class KVCache:
    """Preallocated per-slot key/value storage for a stack of attention layers."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_slots: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if num_slots < 1 or max_len < 1:
            raise ValueError(f"KVCache needs num_slots >= 1 and max_len >= 1, got {num_slots}, {max_len}")
        self.num_layers, self.num_slots, self.max_len = num_layers, num_slots, max_len
        shape = (num_layers, num_slots, num_kv_heads, max_len, head_dim)
        # zeros, not empty: commits the memory now (an oversized cache fails here, not mid-run), and
        # batched attention reads (with probability 0) past shorter slots' lengths: never NaN garbage
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._lengths = [0] * num_slots

    def length(self, slot: int) -> int:
        """Committed tokens in ``slot`` (a host int)."""
        return self._lengths[slot]

    def rewind(self, slot: int, new_length: int) -> None:
        """Drop the entries at positions >= ``new_length`` (e.g. rejected drafts)."""
        self._check_slot(slot)
        if not 0 <= new_length <= self._lengths[slot]:
            raise ValueError(f"cannot rewind slot {slot} from length {self._lengths[slot]} to {new_length}")
        self._lengths[slot] = new_length

    def keep_rows(self, slot: int, start: int, rows: list[int]) -> None:
        """Tree verification: keep the entries at positions ``start + rows[j]`` (rows ascending) as
        positions ``start + j`` of every layer and drop everything after them."""
        if rows != sorted(set(rows)) or (rows and (rows[0] < 0 or start + rows[-1] >= self._lengths[slot])):
            raise ValueError(f"slot {slot}: cannot keep rows {rows} after position {start}")
        if rows != list(range(len(rows))):
            source = torch.tensor([start + row for row in rows], device=self.k.device)
            target = torch.arange(start, start + len(rows), device=self.k.device)
            for buffer in (self.k, self.v):
                buffer[:, slot, :, target] = buffer[:, slot, :, source]
        self.rewind(slot, start + len(rows))

    def check_fits(self, slot: int, extra_tokens: int) -> None:
        """Raise ``CacheOverflowError`` unless ``extra_tokens`` more entries fit in ``slot``."""
        self._check_slot(slot)
        if self._lengths[slot] + extra_tokens > self.max_len:
            raise CacheOverflowError(
                f"slot {slot}: {self._lengths[slot]} cached + {extra_tokens} new tokens exceed "
                f"max_len={self.max_len}; finish the request or create the cache with a larger max_len"
            )

    def advance(self, slot: int, num_tokens: int) -> None:
        """Commit ``num_tokens`` entries just written past the current length (used by the model)."""
        self.check_fits(slot, num_tokens)
        self._lengths[slot] += num_tokens

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Key and value buffers of one layer, each [num_slots, num_kv_heads, max_len, head_dim]."""
        return self.k[index], self.v[index]

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"slot {slot} out of range (cache has {self.num_slots} slots)")
