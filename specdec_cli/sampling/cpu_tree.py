"""The compiled CPU walks of ``sampling.tree.tree_accept``: a whole draft tree verified in one pass per row.

The torch walk runs ~15 small ops per sibling tried over [B, V] float64 rows (gather, one-hot, clamp, sum,
divide, where) and a cumsum + two searchsorteds per final draw: 0.8-2.5 ms for a 4-node chain over a 49k
vocabulary (0.2 ms here; benchmarks/results_steps.md). Each batch row keeps its residual in a float64 work row:
  residual <- the target row at the current node;
  each child in order: accept iff u * q(c) < residual(c); else residual <- max(residual - q, 0), renormalised
  (kept when that is all zero);
  no child accepted: the final token by inverse CDF over the residual (first token whose sequential float64
  cumulative weight exceeds u * total, the last positive one if rounding says none), as ``draws.inverse_cdf``.
Same algorithm, same uniforms, same float64 comparisons; only the residual's mass is summed in another order
than torch's, so a token can differ from the torch walk's only where a uniform lands within an ulp of a
boundary. ``traversal_walk`` (``verification="block"``) runs the traversal walk of ``sampling.traversal``
the same way: a weight and a float64 work row per tree level, the post-order events precomputed. This module
imports numba at the top: ``tree`` imports it lazily and keeps its torch walks where that fails.
"""
from __future__ import annotations

from typing import Optional

import numba
import numpy as np
import torch

from specdec_cli.numba_setup import use_wide_vectors

use_wide_vectors()

_DTYPES = (torch.float32, torch.float64)


def usable(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether these probability tensors can go to the kernel: CPU and float32/float64 (None: one-hot)."""
    return all(t is None or (t.device.type == "cpu" and t.dtype in _DTYPES) for t in tensors)


def tree_walk(target_probs: torch.Tensor, node_tokens: torch.Tensor, parents: torch.Tensor,
              node_draft_probs: Optional[torch.Tensor], uniforms: torch.Tensor,
              depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``tree_accept``'s outputs for checked inputs: target_probs [B, N+1, V], node_tokens [B, N] int64, parents
    [N] int64, node_draft_probs [B, N, V] or None (one-hot), uniforms [B, N+1] float64, depth D -> (tokens
    [B, D+1] padded with -1, num_emitted [B], path [B, D] padded with -1)."""
    batch, num_nodes = node_tokens.shape
    order = torch.argsort(parents, stable=True)  # children grouped by parent, in node order
    starts = torch.searchsorted(parents[order].contiguous(), torch.arange(-1, num_nodes + 1))
    one_hot = node_draft_probs is None
    draft = target_probs[:, :1, :1] if one_hot else node_draft_probs  # never read when one-hot
    tokens = np.full((batch, depth + 1), -1, dtype=np.int64)
    path = np.full((batch, max(depth, 1)), -1, dtype=np.int64)
    emitted = np.empty(batch, dtype=np.int64)
    _walk_rows(_array(target_probs), _array(node_tokens), _array(draft), one_hot, _array(starts),
               _array(order), _array(uniforms.to(torch.float64)), tokens, path, emitted)
    return torch.from_numpy(tokens), torch.from_numpy(emitted), torch.from_numpy(path[:, :depth])


def traversal_walk(target_probs: torch.Tensor, node_tokens: torch.Tensor, parents: torch.Tensor,
                   node_draft_probs: Optional[torch.Tensor], uniforms: torch.Tensor, events: list[int],
                   levels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``tree_accept(verification="block")``'s outputs for checked inputs (those of ``tree_walk``, with the tree's
    post-order ``events`` (``traversal.depth_first_events``) and its node depths levels [N] int64 for the depth)."""
    batch = node_tokens.shape[0]
    depth = int(levels.max()) if levels.numel() else 0
    one_hot = node_draft_probs is None
    draft = target_probs[:, :1, :1] if one_hot else node_draft_probs  # never read when one-hot
    tokens = np.full((batch, depth + 1), -1, dtype=np.int64)
    path = np.full((batch, max(depth, 1)), -1, dtype=np.int64)
    emitted = np.empty(batch, dtype=np.int64)
    _traverse_rows(_array(target_probs), _array(node_tokens), _array(draft), one_hot, np.array(events, dtype=np.int64),
                   _array(levels), _array(parents), _array(uniforms.to(torch.float64)), tokens, path, emitted)
    return torch.from_numpy(tokens), torch.from_numpy(emitted), torch.from_numpy(path[:, :depth])


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().contiguous().numpy()


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _leftover(residual, draft_row, one_hot, token, leftover):
    """leftover <- max(residual - q, 0) (q one-hot at ``token`` or ``draft_row``); returns its float64 mass."""
    mass = 0.0
    for j in range(residual.shape[0]):
        q = (1.0 if j == token else 0.0) if one_hot else np.float64(draft_row[j])
        value = max(residual[j] - q, 0.0)
        leftover[j] = value
        mass += value
    return mass


@numba.njit(cache=True, nogil=True)
def _inverse_cdf(weights, uniform):
    """First index whose sequential float64 cumulative weight exceeds ``uniform * total``; the first index that
    reaches the total where rounding puts the needle at or past it (never a zero-weight index)."""
    total = 0.0
    for j in range(weights.shape[0]):
        total += weights[j]
    needle, cumulative = uniform * total, 0.0
    for j in range(weights.shape[0]):
        cumulative += weights[j]
        if cumulative > needle or cumulative >= total:
            return j
    return weights.shape[0] - 1


@numba.njit(cache=True, nogil=True)
def _walk_rows(target, node_tokens, draft, one_hot, starts, children, uniforms, tokens, path, emitted):
    """Every batch row in order; row b's children of verify row r are children[starts[r]:starts[r + 1]]."""
    vocab, num_nodes = target.shape[2], node_tokens.shape[1]
    residual, leftover = np.empty(vocab), np.empty(vocab)
    for b in range(node_tokens.shape[0]):
        row, level = 0, 0
        while True:
            for j in range(vocab):
                residual[j] = np.float64(target[b, row, j])
            accepted = -1
            for c in range(starts[row], starts[row + 1]):
                node = children[c]
                token = node_tokens[b, node]
                q_at = 1.0 if one_hot else np.float64(draft[b, node, token])
                if uniforms[b, node] * q_at < residual[token]:
                    accepted = node
                    break
                mass = _leftover(residual, draft[b, 0] if one_hot else draft[b, node], one_hot, token, leftover)
                if mass > 0.0:
                    for j in range(vocab):
                        residual[j] = leftover[j] / mass
            if accepted < 0:
                tokens[b, level] = _inverse_cdf(residual, uniforms[b, num_nodes])
                emitted[b] = level + 1
                break
            tokens[b, level] = node_tokens[b, accepted]
            path[b, level] = accepted
            row, level = accepted + 1, level + 1


@numba.njit(cache=True, nogil=True)
def _traverse_rows(target, node_tokens, draft, one_hot, events, levels, parents, uniforms, tokens, path, emitted):
    """Every batch row in order: events >= 0 enter node e, < 0 leave node -1 - e (``traversal.depth_first_events``)."""
    vocab, num_nodes, max_level = target.shape[2], node_tokens.shape[1], tokens.shape[1]
    rows, weight, leftover = np.empty((max_level, vocab)), np.empty(max_level), np.empty(vocab)
    for b in range(node_tokens.shape[0]):
        for j in range(vocab):
            rows[0, j] = np.float64(target[b, 0, j])
        weight[0] = 1.0
        stop, level = -1, 0
        for e in range(events.shape[0]):
            node = events[e] if events[e] >= 0 else -1 - events[e]
            level, token = levels[node], node_tokens[b, node]
            q_at = 1.0 if one_hot else np.float64(draft[b, node, token])
            if events[e] >= 0:  # enter
                ratio = rows[level - 1, token] / q_at if q_at > 0.0 else 0.0
                weight[level] = min(weight[level - 1] * ratio, 1.0)
                for j in range(vocab):
                    rows[level, j] = np.float64(target[b, node + 1, j])
                continue
            if uniforms[b, node] < weight[level]:
                stop = node
                break
            # the parent takes the failure
            w = weight[level - 1]
            mass = 0.0
            for j in range(vocab):
                q = (1.0 if j == token else 0.0) if one_hot else np.float64(draft[b, node, j])
                value = max(w * rows[level - 1, j] - q, 0.0)
                leftover[j] = value
                mass += value
            if mass > 0.0:
                for j in range(vocab):
                    rows[level - 1, j] = leftover[j] / mass
            if 1.0 - w + mass > 0.0:
                weight[level - 1] = mass / (1.0 - w + mass)
        level = 0 if stop < 0 else levels[stop]
        node = stop
        for at in range(level - 1, -1, -1):
            path[b, at] = node
            tokens[b, at] = node_tokens[b, node]
            node = parents[node]
        tokens[b, level] = _inverse_cdf(rows[level], uniforms[b, num_nodes])
        emitted[b] = level + 1
