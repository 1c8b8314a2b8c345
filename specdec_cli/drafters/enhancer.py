"""The suffix enhancer (TensorRT-LLM's suffix-automaton "overrides") around any model drafter.

Per step and request, the suffix automaton of ``drafters/suffix.py`` looks for the longest suffix of the
request's own prompt + output that occurred earlier. When that match has at least ``min_match`` tokens, the
request's drafts are the retrieval continuation (what followed the earlier occurrence, up to k tokens) with a
one-hot q, the q they were "drawn" from; otherwise they are the model's, with the model's q.

Positions: an overridden request sends only retrieval tokens. Its chain ends where the continuation ends (the
match reached the newest tokens) and is never continued with model drafts, which were conditioned on the model's
own earlier tokens, not on the retrieval ones. The retrieval tokens are target ids and their q is one-hot there
(``Proposal.one_hot_rows``), so a token outside a reduced draft vocabulary (a rare word copied from the prompt:
the tokens retrieval is best at) is drafted too. So every sent token's q is exactly the distribution it was
drawn from and rejection sampling stays exact at T > 0. The model still runs on overridden requests (one draft,
discarded) so that a drafter fed by target features stays caught up.

Trees (``propose_tree``, EAGLE-3 with ``method.tree_topk > 1``): an overridden request's tree is the retrieval
continuation as a chain of up to ``max_nodes`` nodes, deeper than the model's ``depth`` (K): the verify's node
budget costs the same rows either way (one-hot q in target ids: ``DraftTree.draft_probs`` None), else the model's
tree. Whether a request is overridden depends only on its committed tokens, never on a draw, so tree rejection
stays exact.
"""
from __future__ import annotations

from typing import Optional

import torch

from specdec_cli.config.schema import SuffixMethodConfig
from specdec_cli.drafters.base import Drafter, DraftRequest, Proposal
from specdec_cli.drafters.eagle3_tree import DraftTree
from specdec_cli.drafters.suffix import SuffixDrafter
from specdec_cli.sampling import BatchParams, one_hot


class SuffixEnhancer(Drafter):
    """``model``'s proposals, overridden per request by its own suffix match (see the module doc)."""

    def __init__(self, model: Drafter, *, min_match: int, vocab_size: int) -> None:
        self.model = model
        self.retrieval = SuffixDrafter(SuffixMethodConfig(min_match_len=min_match), vocab_size)
        self.draft_vocab_size, self.d2t = model.draft_vocab_size, model.d2t
        self.has_proposal_distribution = model.has_proposal_distribution
        self.hidden_layers, self.needs_final_hidden = model.hidden_layers, model.needs_final_hidden
        self.overridden = 0  # requests whose drafts were the retrieval continuation (one per step)

    def add_request(self, slot: int, prompt_ids: list[int]) -> None:
        self.model.add_request(slot, prompt_ids)
        self.retrieval.add_request(slot, prompt_ids)

    def remove_request(self, slot: int, token_ids: list[int]) -> None:
        self.model.remove_request(slot, token_ids)
        self.retrieval.remove_request(slot, token_ids)

    def forget_finished(self) -> None:
        self.model.forget_finished()
        self.retrieval.forget_finished()

    def propose(self, requests: list[DraftRequest], k: int, params: BatchParams) -> Proposal:
        found = self.retrieval.propose(requests, k, params)
        lengths = found.num_drafts
        if not any(lengths):  # no suffix match anywhere (most steps): the model's proposal as it is
            return self.model.propose(requests, k, params)
        device = params.temperature.device  # the model's; retrieval runs on the host and is copied once
        tokens = torch.zeros(len(requests), k, dtype=torch.int64, device=device)
        probs = torch.zeros(len(requests), k, self.draft_vocab_size, device=device)
        num_drafts = list(lengths)
        for overridden, rows in _groups(lengths).items():
            proposal = self.model.propose([requests[r] for r in rows], 1 if overridden else k, params.select(rows))
            if overridden:
                tokens[rows] = found.tokens[rows].to(device)
                continue  # the model only kept up with these requests
            tokens[rows] = proposal.tokens
            probs[rows] = proposal.draft_probs if proposal.draft_probs is not None else one_hot(
                proposal.tokens, self.draft_vocab_size)
            for row, num in zip(rows, proposal.num_drafts):
                num_drafts[row] = num
        overridden_rows = tuple(row for row, num in enumerate(lengths) if num)
        self.overridden += len(overridden_rows)
        return Proposal(tokens=tokens, draft_probs=probs, num_drafts=num_drafts, one_hot_rows=overridden_rows)

    def propose_tree(self, request: DraftRequest, depth: int, max_nodes: int,
                     params: Optional[BatchParams] = None) -> DraftTree:
        """The retrieval continuation as a chain-shaped tree of up to ``max_nodes`` nodes where the request's
        suffix matches (the model's tree drafter still catches up, its one-node tree discarded), else the model's
        tree of ``depth`` levels (``propose_tree``'s contract)."""
        found = self.retrieval.propose([request], max_nodes, params)
        num = found.num_drafts[0]
        tree = self.model.propose_tree(request, 1 if num else depth, 1 if num else max_nodes, params)
        if not num:
            return tree
        self.overridden += 1
        return DraftTree(found.tokens[0, :num].tolist(), list(range(-1, num - 1)), list(range(1, num + 1)))


def _groups(lengths: list[int]) -> dict[bool, list[int]]:
    """Rows by whether the retrieval continuation overrides them (``lengths[row] > 0``)."""
    groups: dict[bool, list[int]] = {}
    for row, num in enumerate(lengths):
        groups.setdefault(num > 0, []).append(row)
    return groups

