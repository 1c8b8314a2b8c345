"""Traversal verification of draft trees (``tree.tree_accept(verification="block")``).

Block verification generalised from chains to trees (Weng et al., "Traversal Verification for Speculative Tree
Decoding", 2025): each root-to-node path is judged as a whole, so a child whose own test is marginal still
counts when its subtree agrees with the target. Each node carries a weight w (root: 1) and a target row pi (its
target row, then its residual):
  enter child c of x:  w_c = min(w_x * pi_x(c) / q_c(c), 1), pi_c = the target row at c;
  leave c (every child of c has failed): c passes iff u_c < w_c: emit the path to c and one token from pi_c, stop;
                       else x takes the failure: m = sum_v max(w_x pi_x(v) - q_c(v), 0),
                       pi_x <- normalize(max(w_x pi_x - q_c, 0)), w_x <- m / (1 - w_x + m);
  the root never fails (its weight stays 1): when every child of the root has failed, emit one token from pi_root.
Nodes are entered and left depth-first in node order (a post-order walk). Exactness, by induction from the
leaves: a node verified at weight w with row pi passes with its next token distributed as w * pi and fails
with probability 1 - w, averaged over its subtree's drafts (a leaf is tested once: true). Then at x with
children c_1 ~ q_1, ...: c_1 passes with next token t with probability q_1(t) min(1, w pi(t) / q_1(t)) =
min(w pi(t), q_1(t)); it fails with probability 1 - w + m whatever its token, and the rest of x (later
children, then x's own test) runs at weight m / (1 - w + m) with row normalize(max(w pi - q_1, 0)), so it passes
with next token t with probability max(w pi(t) - q_1(t), 0) and fails with probability 1 - w in all: x passes
with next token w * pi(t). At the root (w = 1, pi its target row) the first token follows the target, and
the same holds below every accepted node, so the output follows the target's autoregressive law. For a chain
this is ``acceptance.block_verify``; with a one-hot target it follows the argmax path. It keeps more drafts
than node-by-node tree rejection (``tree``) on average, and never fewer in expectation for a fixed tree shape
in exact enumeration (``benchmarks/enumerate_traversal.py``: +2-5% for children drawn without replacement,
equal for deterministic ones); a shape that depends on the drafted tokens (the confidence stop) can lose a
little (-0.5% at worst over 100 random instances). tests/sampling/test_sampling_traversal.py checks the
generated sequence law for deterministic and without-replacement siblings and for level-by-level trees whose
slots depend on other subtrees and on a confidence stop.

This module holds the batched torch walk (accelerators, or no numba) and the post-order events both walks
follow; the compiled CPU walk is ``cpu_tree.traversal_walk``. Same N + 1 uniforms per row as ``tree``.
"""
from __future__ import annotations

from typing import Optional

import torch

from specdec_cli.sampling.acceptance import PLACEHOLDER_TOKEN_ID
from specdec_cli.sampling.draws import inverse_cdf


def depth_first_events(parents: list[int]) -> list[int]:
    """The post-order walk of a tree as events: node i entered is ``i``, node i left is ``-1 - i`` (children
    in node order; the root is neither entered nor left)."""
    children = [[i for i, p in enumerate(parents) if p == node] for node in range(-1, len(parents))]
    events: list[int] = []
    stack = [(child, False) for child in reversed(children[0])]
    while stack:
        node, leaving = stack.pop()
        if leaving:
            events.append(-1 - node)
            continue
        events.append(node)
        stack.append((node, True))
        stack += [(child, False) for child in reversed(children[node + 1])]
    return events


def traversal_walk(target_probs: torch.Tensor, node_tokens: torch.Tensor, parents: torch.Tensor,
                   node_draft_probs: Optional[torch.Tensor], uniforms: torch.Tensor, events: list[int],
                   node_levels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``tree_accept(verification="block")`` in torch (the module doc's traversal walk), batched over rows;
    ``events`` from ``depth_first_events``, node_levels [N] from ``tree_depths``.

    State per tree level (one node per level is open at a time): weight [B, D+1] and row [B, D+1, V] float64
    (level 0: the root)."""
    batch, rows, vocab = target_probs.shape
    device, parent_list, levels = target_probs.device, parents.tolist(), node_levels.tolist()
    depth = max(levels, default=0)
    index = torch.arange(batch, device=device)
    weight = torch.ones(batch, depth + 1, dtype=torch.float64, device=device)
    row = torch.zeros(batch, depth + 1, vocab, dtype=torch.float64, device=device)
    row[:, 0] = target_probs[:, 0].double()
    tokens = torch.full((batch, depth + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    path = torch.full((batch, depth), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    emitted = torch.zeros(batch, dtype=torch.int64, device=device)
    live = torch.ones(batch, dtype=torch.bool, device=device)

    def emit(passed: torch.Tensor, node: int, level: int) -> None:
        """Rows ``passed`` stop at ``node`` (-1: the root): its path, then one token from its row."""
        ancestors = []
        while node >= 0:
            ancestors.append(node)
            node = parent_list[node]
        for at, ancestor in enumerate(reversed(ancestors)):
            path[passed, at] = ancestor
            tokens[passed, at] = node_tokens[passed, ancestor]
        tokens[passed, level] = inverse_cdf(row[:, level], uniforms[:, rows - 1])[passed]
        emitted[passed] = level + 1

    for event in events:
        node = event if event >= 0 else -1 - event
        level, token = levels[node], node_tokens[:, node]
        above = row[:, level - 1]
        draft = None if node_draft_probs is None else node_draft_probs[:, node].double()  # None: one-hot
        if event >= 0:  # enter: the node's weight from its parent's current weight and row
            q_at = torch.ones(batch, dtype=torch.float64, device=device) if draft is None else draft[index, token]
            ratio = torch.where(q_at > 0, above[index, token] / q_at.clamp(min=1e-300), 0.0)
            weight[:, level] = torch.minimum(weight[:, level - 1] * ratio, torch.ones_like(ratio))
            row[:, level] = target_probs[:, node + 1].double()
            continue
        passed = live & (uniforms[:, node] < weight[:, level])
        if bool(passed.any()):
            emit(passed, node, level)
        live &= ~passed
        # the parent takes the failure
        scaled = weight[:, level - 1, None] * above
        leftover = (scaled - draft).clamp_(min=0) if draft is not None else scaled.scatter_add(
            1, token[:, None], -torch.ones(batch, 1, dtype=torch.float64, device=device)).clamp_(min=0)
        mass = leftover.sum(dim=-1)
        denominator = 1 - weight[:, level - 1] + mass
        update = live & (mass > 0)
        row[:, level - 1] = torch.where(update[:, None], leftover / mass.clamp(min=1e-300)[:, None], above)
        weight[:, level - 1] = torch.where(live & (denominator > 0), mass / denominator.clamp(min=1e-300),
                                           weight[:, level - 1])
    if bool(live.any()):
        emit(live, -1, 0)
    return tokens, emitted, path
