"""EAGLE-3 dynamic draft trees (EAGLE-2's expansion) on the feature-head drafter.

``TreeFeatureDrafter.propose_tree`` catches up on the target features like the chain, then grows a tree
from the last committed token (the root):
  depth 1:      the root's ``topk`` most probable draft tokens;
  depth d >= 2: the frontier (the ``topk`` best nodes of depth d-1 by cumulative draft log-probability) is fed
                to the head in one call, each row attending to the committed head cache, its ancestors' rows
                and itself (``TreeRows``); each frontier node offers its ``topk`` best children, all of which
                join the candidate pool, and the ``topk`` best of them form the next frontier;
  finally:      the ``max_nodes`` best candidates by cumulative log-probability (ties: the earlier one) are
                the tree, after the spine (the chain's own drafts: each level's top-1 child of the previous
                spine node, always expanded and kept, so the tree never accepts less than the chain).
                A child never scores above its parent, so the kept set contains every ancestor.
  confidence:   ``method.draft_confidence`` > 0 stops growing after the level whose spine draft's own
                probability is below it (the chain's stop, on the chain's drafts): fewer head steps and
                verified nodes where the head is unsure.
Scores use the head's raw softmax (temperature 1). Children chosen this way are deterministic, so the
distribution each node was drawn from is one-hot at it (``DraftTree.draft_probs`` None): used for greedy rows
(and ``draft_policy=argmax``); ``sampling.tree.tree_accept`` verifies such a tree exactly at any temperature.

Sampled rows (temperature > 0) draw each expanded node's children WITHOUT replacement from q, the head's
distribution under the row's filters (``probs_from_logits``), with the row's generator; child j was drawn from
q without children 1..j-1 (``without_replacement_probs``: ``draft_probs`` [N, Vd]). ``tree_accept`` is exact
only if whether child j exists never depends on child j itself (nor on what was drawn after it), so this tree
is grown level by level and nothing is pruned after a draw:
  level d gets ``min(topk, budget left - levels after d)`` children (one node kept for each later level);
  the first child of the first-child chain (the "spine", the chain drafter's own drafts) always gets one;
  the other slots (node x, j-th child) go by cum(x) + log(j-th largest q(x)), which is known before drawing;
  the nodes expanded at the next level are the spine node and the best others by cumulative log q;
  the confidence stop ends the tree after a level whose spine draft has q below ``draft_confidence``: whether
  later levels exist then depends only on nodes drawn before them, as ``tree_accept`` requires.
The tree contains the chain's drafts (the spine, drawn exactly as the chain draws them) and its siblings only
add chances, so its acceptance is never below the chain's in distribution.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from specdec_cli.drafters.base import DraftRequest, drafting_params
from specdec_cli.drafters.feature_head import FeatureDrafter, FeatureHead
from specdec_cli.models import Transformer
from specdec_cli.models.layers import RaggedBatch, TreeRows
from specdec_cli.sampling import BatchParams, draft_to_target_ids, probs_from_logits
from specdec_cli.sampling.tree import draw_without_replacement, without_replacement_probs


class DraftTree(NamedTuple):
    """A draft tree in topological order: tokens [N] target ids, parents [N] (-1: the root), depths [N]
    (children of the root: 1); siblings in the order they are to be tried (descending draft probability, or
    draw order). draft_probs [N, Vd] (draft vocabulary): the q each node was drawn from, None: one-hot."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    draft_probs: Optional[torch.Tensor] = None


class TreeFeatureDrafter(FeatureDrafter):
    """A ``FeatureDrafter`` that also proposes dynamic trees (batch 1; see the module doc)."""

    def __init__(self, head: FeatureHead, target: Transformer, *, num_slots: int, max_seq_len: int, policy: str,
                 topk: int, max_depth: int) -> None:
        # room past the committed rows for every frontier of a tree (topk rows per depth)
        super().__init__(head, target, num_slots=num_slots, max_seq_len=max_seq_len + topk * max_depth,
                         policy=policy)
        self.topk = topk

    @torch.inference_mode()
    def propose_tree(self, request: DraftRequest, depth: int, max_nodes: int,
                     params: Optional[BatchParams] = None) -> DraftTree:
        """A tree of at most ``max_nodes`` nodes and ``depth`` levels for one request (depth, max_nodes >= 1);
        ``params``: the request's one row (None or temperature 0: deterministic top-k children)."""
        slot, device = request.slot, self.head.embed_weight.device
        features, tokens, counts = self._catch_up([request])
        out = self._step(self.head.fuse(features), tokens.to(device), [slot], counts)[-1:]
        committed = self.cache.length(slot)
        row = None if params is None else drafting_params(params, self.policy)
        if row is not None and bool(row.temperature[0] > 0):
            return self._sampled_tree(out, row, depth, max_nodes, slot, committed)
        # candidate pool: draft id, parent pool index, score, depth; cache row of the fed (frontier) nodes
        draft_ids: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        depths: list[int] = []
        fed_row: dict[int, int] = {}
        frontier, frontier_out, spine, spine_pos = [-1], out, [], 0  # spine: the chain's drafts (top-1 children)
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
            ranks = list(range(min(self.topk, len(order))))
            spine_rank = order.index(spine_pos * best.shape[1])
            if spine_rank not in ranks:  # the spine is always expanded
                ranks[-1] = spine_rank
            spine.append(first_new + spine_rank)
            if float(best[spine_pos, 0].exp()) < self.draft_confidence:  # the chain's confidence stop
                break
            spine_pos = ranks.index(spine_rank)
            frontier_out = frontier_out[[order[rank] // best.shape[1] for rank in ranks]]
            frontier = [first_new + rank for rank in ranks]
        return self._select(draft_ids, parents, scores, depths, max_nodes, set(spine))

    def _sampled_tree(self, out: torch.Tensor, row: BatchParams, depth: int, max_nodes: int, slot: int,
                      committed: int) -> DraftTree:
        """Children drawn without replacement, level by level, no pruning after a draw (see the module doc).
        out [1, H]: the head's output at the root; row: the request's (sampled) parameters."""
        draft_ids: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        depths: list[int] = []
        node_probs: list[torch.Tensor] = []
        fed_row: dict[int, int] = {}
        frontier, frontier_out, budget_left = [-1], out, max_nodes
        depth = min(depth, max_nodes)  # one node per level at least
        for level in range(1, depth + 1):
            if level > 1:
                frontier_out = self._feed_frontier(frontier, draft_ids, parents, fed_row, frontier_out, slot,
                                                   position=committed + level - 2, committed=committed)
            width = len(frontier)
            q = probs_from_logits(self.head.logits(frontier_out).float(), row.temperature.expand(width),
                                  row.top_k.expand(width), row.top_p.expand(width))
            topk = min(self.topk, q.shape[-1])
            children = draw_without_replacement(q, topk, row.generators[0])  # [W, topk]; frontier[0]: the spine
            sibling_probs = without_replacement_probs(q, children.clamp(min=0))  # [W, topk, Vd]
            base = torch.tensor([0.0 if node < 0 else scores[node] for node in frontier], dtype=torch.float64)
            slot_scores = base[:, None] + q.topk(topk, dim=-1).values.double().log().cpu()
            slot_scores[0, 0] = float("inf")  # the spine's next draft
            num_new = min(self.topk, budget_left - (depth - level))
            ranked = sorted(((-float(slot_scores[i, j]), i, j) for i in range(width) for j in range(topk)
                             if slot_scores[i, j] > float("-inf")))
            chosen = sorted((i, j) for _, i, j in ranked[:num_new])  # per node a prefix of its draws
            first_new = len(draft_ids)
            for i, j in chosen:
                token = int(children[i, j])
                draft_ids.append(token)
                parents.append(frontier[i])
                scores.append(float(base[i]) + float(q[i, token].double().log()))
                depths.append(level)
                node_probs.append(sibling_probs[i, j])
            budget_left -= len(chosen)
            if level == depth or float(q[0, children[0, 0]]) < self.draft_confidence:  # the confidence stop
                break
            width = min(self.topk, budget_left - (depth - level - 1), len(chosen))
            others = sorted(range(1, len(chosen)), key=lambda n: (-scores[first_new + n], n))
            keep = [0, *others[: width - 1]]  # the spine's new node first
            frontier_out = frontier_out[[chosen[n][0] for n in keep]]
            frontier = [first_new + n for n in keep]
        tokens = draft_to_target_ids(torch.tensor(draft_ids, dtype=torch.int64), self.d2t)
        return DraftTree(tokens.tolist(), parents, depths, torch.stack(node_probs))

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
        out = self.head(self.head.recycle(parent_out), token_ids.to(device), self.cache_attention(batch))
        self.cache.advance(slot, width)
        return out

    def _select(self, draft_ids: list[int], parents: list[int], scores: list[float], depths: list[int],
                max_nodes: int, spine: set[int]) -> DraftTree:
        """The spine (the chain's drafts, ``max_nodes`` >= its length), then the best other candidates up to
        ``max_nodes``, in pool (topological) order, parents re-indexed."""
        ranked = sorted(range(len(draft_ids)), key=lambda node: (node not in spine, -scores[node], node))
        kept = sorted(ranked[:max_nodes])
        index = {node: i for i, node in enumerate(kept)}
        tokens = draft_to_target_ids(torch.tensor([draft_ids[n] for n in kept], dtype=torch.int64), self.d2t)
        return DraftTree(tokens.tolist(), [index[parents[n]] if parents[n] >= 0 else -1 for n in kept],
                         [depths[n] for n in kept])
