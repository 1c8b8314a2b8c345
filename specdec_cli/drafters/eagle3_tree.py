"""EAGLE-3 dynamic draft trees (EAGLE-2's expansion) on the feature-head drafter.

``TreeFeatureDrafter.propose_tree`` catches up on the target features like the chain, then grows a tree
from the last committed token (the root):
  depth 1:      the root's ``topk`` most probable draft tokens;
  depth d >= 2: the frontier (the ``topk`` best nodes of depth d-1 by cumulative draft log-probability) is fed
                to the head in one call, each row attending to the committed head cache, its ancestors' rows
                and itself (``TreeRows``); each frontier node offers its ``topk`` best children, all of which
                join the candidate pool, and the ``topk`` best of them form the next frontier;
  finally:      the ``max_nodes`` best candidates by cumulative log-probability (ties: the earlier one) are
                the tree. A child never scores above its parent, so the kept set contains every ancestor.
Scores use the head's raw softmax (temperature 1): the request's sampling never changes the tree's shape.
Children are chosen deterministically, so the distribution each node was drawn from is one-hot at it:
``sampling.tree.tree_accept`` with ``node_draft_probs=None`` verifies the tree exactly at any temperature.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from specdec_cli.drafters.base import DraftRequest
from specdec_cli.drafters.feature_head import FeatureDrafter, FeatureHead
from specdec_cli.models import Transformer
from specdec_cli.models.layers import RaggedBatch, TreeRows
from specdec_cli.sampling import draft_to_target_ids


class DraftTree(NamedTuple):
    """A draft tree in topological order: tokens [N] target ids, parents [N] (-1: the root), depths [N]
    (children of the root: 1); siblings are in descending draft probability."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]


class TreeFeatureDrafter(FeatureDrafter):
    """A ``FeatureDrafter`` that also proposes dynamic trees (batch 1; see the module doc)."""

    def __init__(self, head: FeatureHead, target: Transformer, *, num_slots: int, max_seq_len: int, policy: str,
                 topk: int, max_depth: int) -> None:
        # room past the committed rows for every frontier of a tree (topk rows per depth)
        super().__init__(head, target, num_slots=num_slots, max_seq_len=max_seq_len + topk * max_depth,
                         policy=policy)
        self.topk = topk

    @torch.inference_mode()
    def propose_tree(self, request: DraftRequest, depth: int, max_nodes: int) -> DraftTree:
        """A tree of at most ``max_nodes`` nodes and ``depth`` levels for one request (depth, max_nodes >= 1)."""
        slot, device = request.slot, self.head.embed_weight.device
        features, tokens, counts = self._catch_up([request])
        out = self._step(self.head.fuse(features), tokens.to(device), [slot], counts)[-1:]
        committed = self.cache.length(slot)
        # candidate pool: draft id, parent pool index, score, depth; cache row of the fed (frontier) nodes
        draft_ids: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        depths: list[int] = []
        fed_row: dict[int, int] = {}
        frontier, frontier_out = [-1], out
        for level in range(1, depth + 1):
            if level > 1:
                frontier_out = self._feed_frontier(frontier, draft_ids, parents, fed_row, frontier_out, slot,
                                                   position=committed + level - 2, committed=committed)
            logprobs = torch.log_softmax(self.head.logits(frontier_out).float(), dim=-1).cpu()
            best, best_ids = logprobs.topk(min(self.topk, logprobs.shape[-1]), dim=-1)
            base = torch.tensor([0.0 if node < 0 else scores[node] for node in frontier], dtype=torch.float64)
            cumulative = (base[:, None] + best.double()).flatten()
            order = cumulative.argsort(descending=True, stable=True).tolist()
            first_new = len(draft_ids)
            for flat in order:
                draft_ids.append(int(best_ids.flatten()[flat]))
                parents.append(frontier[flat // best.shape[1]])
                scores.append(float(cumulative[flat]))
                depths.append(level)
            chosen = list(range(first_new, first_new + min(self.topk, len(order))))
            frontier_out = frontier_out[[order[i - first_new] // best.shape[1] for i in chosen]]
            frontier = chosen
        return self._select(draft_ids, parents, scores, depths, max_nodes)

    def _feed_frontier(self, frontier: list[int], draft_ids: list[int], parents: list[int], fed_row: dict[int, int],
                       parent_out: torch.Tensor, slot: int, *, position: int, committed: int) -> torch.Tensor:
        """Feed the frontier nodes (hidden: their parents' outputs, recycled) as new head-cache rows at RoPE
        ``position``; each sees the committed rows, its fed ancestors and itself. Returns their outputs [W, H]."""
        start, width = self.cache.length(slot), len(frontier)
        visible = torch.zeros(width, start + width, dtype=torch.bool)
        visible[:, :committed] = True
        for i, node in enumerate(frontier):
            ancestor = parents[node]
            while ancestor >= 0:
                visible[i, fed_row[ancestor]] = True
                ancestor = parents[ancestor]
            fed_row[node] = start + i
            visible[i, start + i] = True
        token_ids = draft_to_target_ids(torch.tensor([draft_ids[node] for node in frontier]), self.d2t)
        device = self.head.embed_weight.device
        batch = RaggedBatch.build([slot], [start], [width], self.rope, [TreeRows([position] * width, visible)])
        k_cache, v_cache = self.cache.layer(0)
        out = self.head(self.head.recycle(parent_out), token_ids.to(device),
                        lambda attn, x: attn(x, batch, k_cache, v_cache))
        self.cache.advance(slot, width)
        return out

    def _select(self, draft_ids: list[int], parents: list[int], scores: list[float], depths: list[int],
                max_nodes: int) -> DraftTree:
        """The ``max_nodes`` best candidates, in pool (topological) order, parents re-indexed."""
        ranked = sorted(range(len(draft_ids)), key=lambda node: (-scores[node], node))
        kept = sorted(ranked[:max_nodes])
        index = {node: i for i, node in enumerate(kept)}
        tokens = draft_to_target_ids(torch.tensor([draft_ids[n] for n in kept], dtype=torch.int64), self.d2t)
        return DraftTree(tokens.tolist(), [index[parents[n]] if parents[n] >= 0 else -1 for n in kept],
                         [depths[n] for n in kept])
