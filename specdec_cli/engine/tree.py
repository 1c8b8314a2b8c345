"""Tree speculation: the engine step when the drafter proposes a dynamic tree (``method.tree_topk > 1``).

Same phases as ``SpecEngine.step`` (schedule -> target forward -> accept -> finish -> draft), batch 1:
- the verify feeds [last token, node_1..node_N] with ``tree_parents`` (RoPE position = base + depth, each
  node attending to the cached prefix, its ancestors and itself) in ONE target forward;
- acceptance walks the tree: greedy, the longest path matching the target's argmax
  (``sampling.tree_greedy_accept``); T > 0, traversal verification (``rejection.verification=block``, the
  default) or node-by-node recursive rejection over siblings (``token``; both ``sampling.tree_accept``) with
  each node's q: the drafter draws a sampled row's children without replacement and sends the q each was
  drawn from (one-hot where it chose deterministic top-k children);
- the accepted path's K/V rows move to consecutive cache positions and the rest is dropped
  (``KVCache.keep_rows``); its target features go to the drafter as the chain's do.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import torch

from specdec_cli.drafters.eagle3_tree import DraftTree, TreeFeatureDrafter
from specdec_cli.engine.adaptive import draft_len_for
from specdec_cli.engine.engine import EngineOptions, Feed, SpecEngine
from specdec_cli.engine.request import Request, stamp_outputs
from specdec_cli.models import ForwardOutput, Transformer
from specdec_cli.sampling import BatchParams, expand_draft_probs, filtered_probs
from specdec_cli.sampling.tree import tree_accept, tree_greedy_accept

EMPTY_TREE = DraftTree([], [], [])


class TreeSpecEngine(SpecEngine):
    """``SpecEngine`` whose drafts are trees of at most ``max_nodes`` nodes for a greedy request and
    ``sampled_max_nodes`` (default: the same) for a sampled one (one request at a time)."""

    def __init__(self, target: Transformer, drafter: TreeFeatureDrafter, options: EngineOptions, *, max_nodes: int,
                 sampled_max_nodes: Optional[int] = None,
                 decode: Optional[Callable[[list[int]], str]] = None) -> None:
        if options.max_batch_size != 1:
            raise ValueError("tree speculation runs one request at a time (engine.max_batch_size=1)")
        super().__init__(target, drafter, options, decode=decode)
        self.max_nodes = max_nodes
        self.sampled_max_nodes = sampled_max_nodes or max_nodes
        self.trees: dict[int, DraftTree] = {}

    @torch.inference_mode()
    def step(self) -> list[Request]:
        """One tree-speculative iteration (see the module doc); returns the requests that finished in it."""
        started = time.perf_counter()
        self._admit()
        batch = list(self.active)
        params = BatchParams.of(batch)
        feeds, trees = [], []
        for request in batch:
            tree = EMPTY_TREE if request.in_prefill else self.trees.pop(request.slot, EMPTY_TREE)
            feed = self._feed(request) if request.in_prefill else Feed(
                [request.output_token_ids[-1], *tree.tokens], 1 + len(tree.tokens), prefill=False)
            feeds.append(feed)
            trees.append(tree)

        with self.stats.timed("target_forward"):
            self.stats.target_forwards += 1
            output = self.target(
                self.cache, [r.slot for r in batch], [torch.tensor(f.tokens, dtype=torch.int64) for f in feeds],
                logits_for=[f.num_logits for f in feeds], hidden_layers=self.drafter.hidden_layers,
                final_hidden=self.drafter.needs_final_hidden,
                tree_parents=[None if f.prefill else [-1] + [p + 1 for p in t.parents] for f, t in zip(feeds, trees)],
            )

        with self.stats.timed("accept"):
            logits, offsets, failed = self._after_forward(batch, feeds, output, params)
            for row, (request, feed) in enumerate(zip(batch, feeds)):
                if not feed.prefill and row not in failed:
                    emitted, path = self._walk(trees[row], logits[row], params.select([row]))
                    self._commit_path(request, trees[row], emitted, path, output, offsets[row])
            stamp_outputs(batch, time.perf_counter())

        finished = self._finish()

        with self.stats.timed("draft"):
            for request in batch:
                if request.finish_reason is None and not request.in_prefill:
                    self.trees[request.slot] = self._propose(request)
        self.stats.end_step(started, len(batch))
        return finished

    def _walk(self, tree: DraftTree, logits: torch.Tensor, params: BatchParams) -> tuple[list[int], list[int]]:
        """logits [N+1, V] at [root, nodes] -> (emitted tokens, accepted node indices)."""
        if params.all_greedy:
            return tree_greedy_accept(tree.tokens, tree.parents, logits.argmax(dim=-1).tolist())
        target_probs = filtered_probs(logits[None], params)
        draft_probs = None if tree.draft_probs is None else expand_draft_probs(
            tree.draft_probs[None].to(logits.device), self.drafter.d2t, target_probs.shape[-1])
        tokens, emitted, path = tree_accept(
            target_probs, torch.tensor([tree.tokens], dtype=torch.int64, device=logits.device),
            torch.tensor(tree.parents, dtype=torch.int64), draft_probs, params.generators,
            verification=self.acceptance.verification)
        num = int(emitted[0])
        return tokens[0, :num].tolist(), path[0, : num - 1].tolist()

    def _commit_path(self, request: Request, tree: DraftTree, emitted: list[int], path: list[int],
                     output: ForwardOutput, offset: int) -> None:
        """Keep the root and the accepted nodes' K/V (consecutively) and features; append the tokens."""
        self.stats.observe(max(tree.depths, default=0), len(emitted))
        request.steps += 1
        request.emitted_tokens += len(emitted)
        rows = [0] + [node + 1 for node in path]
        start = self.cache.length(request.slot) - (len(tree.tokens) + 1)
        self.cache.keep_rows(request.slot, start, rows)
        if output.hidden or output.final_hidden is not None:
            index = torch.tensor([offset + row for row in rows], device=output.logits.device)
            hidden = {layer: h.index_select(0, index.to(h.device)) for layer, h in output.hidden.items()}
            final = None if output.final_hidden is None else output.final_hidden.index_select(0, index)
            self.pending_hidden.setdefault(request.slot, []).append((hidden, final))
        request.output_token_ids.extend(emitted)

    def _propose(self, request: Request) -> DraftTree:
        """The next tree: depth <= K, nodes <= the request's node budget (greedy or sampled) and the cache's room,
        neither past max_new_tokens (a chain-shaped tree, such as the suffix enhancer's, is as deep as its nodes
        are many)."""
        depth = min(draft_len_for(1, self.options.max_draft_len, self.options.draft_len_schedule),
                    request.remaining - 1)
        room = self.options.max_seq_len - len(request.token_ids)
        budget = self.sampled_max_nodes if request.params.temperature > 0 else self.max_nodes
        nodes = min(budget, room, request.remaining - 1)
        if min(depth, nodes) < 1:
            return EMPTY_TREE
        self.stats.draft_forwards += 1
        return self.drafter.propose_tree(self._draft_request(request), min(depth, nodes), nodes,
                                         BatchParams.of([request], device=self.target.device))
