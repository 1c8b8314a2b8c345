"""Tree verification on the target: one tree-masked forward equals running each root-to-leaf path on its own,
and the KV compaction keeps exactly the accepted path's entries."""
from __future__ import annotations

import pytest
import torch

from specdec_cli.engine.drive import run_to_completion
from specdec_cli.testing import toy_model

PROMPT = [3, 1, 4, 1, 5, 9, 2]
# [root, n0..n5]: parents among the fed rows (the root is row 0)
FED = [6, 11, 12, 13, 14, 15, 16]
PARENTS = [-1, 0, 0, 0, 1, 1, 2]


def _paths(parents: list[int]) -> list[list[int]]:
    leaves = [i for i in range(len(parents)) if i not in parents]
    paths = []
    for leaf in leaves:
        path = [leaf]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        paths.append(path)
    return paths


def _prefilled():
    """A toy model and a 2-slot cache whose slot 0 holds PROMPT; (model, cache, prompt length)."""
    model = toy_model(3, vocab_size=32, num_layers=2)
    cache = model.new_cache(2, 64)
    model(cache, [0], torch.tensor(PROMPT))
    return model, cache, cache.length(0)


@torch.inference_mode()
def test_tree_forward_equals_every_path_alone():
    model, cache, start = _prefilled()
    tree = model(cache, [0], torch.tensor(FED), tree_parents=[PARENTS], hidden_layers=(0,))
    assert cache.length(0) == start + len(FED)
    for path in _paths(PARENTS):
        cache.rewind(1, 0)
        model(cache, [1], torch.tensor(PROMPT))
        alone = model(cache, [1], torch.tensor([FED[i] for i in path]), hidden_layers=(0,))
        torch.testing.assert_close(tree.logits[path], alone.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(tree.hidden[0][path], alone.hidden[0], rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_keep_rows_compacts_the_accepted_path():
    model, cache, start = _prefilled()
    model(cache, [0], torch.tensor(FED), tree_parents=[PARENTS])
    path = [0, 2, 6]
    cache.keep_rows(0, start, path)
    assert cache.length(0) == start + 3
    model(cache, [1], torch.tensor(PROMPT + [FED[i] for i in path]))
    torch.testing.assert_close(cache.k[:, 0, :, : start + 3], cache.k[:, 1, :, : start + 3], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.v[:, 0, :, : start + 3], cache.v[:, 1, :, : start + 3], rtol=1e-5, atol=1e-5)
    # and decoding goes on from the compacted cache as from the plain one
    after = model(cache, [0, 1], [torch.tensor([7]), torch.tensor([7])])
    torch.testing.assert_close(after.logits[0], after.logits[1], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- the engine with a tree drafter
VOCAB = 16
DRAFT_IDS = torch.tensor([0, 1, 2, 3, 5, 6, 8, 9, 10, 12, 13, 15])  # a reduced draft vocabulary (d2t)


def _tree_engine(target, *, topk: int = 3, depth: int = 3, nodes: int = 8, confidence: float = 0.0,
                 enhancer_min_match: int = 0, sampled_nodes: int | None = None, head_layers: int = 1,
                 verification: str = "block"):
    from specdec_cli.drafters.eagle3_tree import TreeFeatureDrafter
    from specdec_cli.engine.engine import EngineOptions
    from specdec_cli.engine.tree import TreeSpecEngine
    from specdec_cli.train.heads import new_eagle3

    head = new_eagle3(target, DRAFT_IDS, hidden_layers=(0, 1, 1), seed=1, num_layers=head_layers)
    drafter = TreeFeatureDrafter(head, target, num_slots=1, max_seq_len=96, policy="sample", topk=topk,
                                 max_depth=depth)
    drafter.draft_confidence = confidence  # what build_drafter sets from method.draft_confidence
    if enhancer_min_match:  # method.suffix_enhancer (on by default): suffix matches proposed as chain-shaped trees
        from specdec_cli.drafters.enhancer import SuffixEnhancer

        drafter = SuffixEnhancer(drafter, min_match=enhancer_min_match, vocab_size=VOCAB)
    options = EngineOptions(max_batch_size=1, max_seq_len=96, prefill_chunk=5, max_draft_len=depth,
                            verification=verification)
    return TreeSpecEngine(target, drafter, options, max_nodes=nodes, sampled_max_nodes=sampled_nodes)


def _generate(engine, prompts, params, max_new):
    from specdec_cli.engine.request import Request

    params = params if isinstance(params, list) else [params] * len(prompts)
    requests = [Request(id=str(i), prompt_token_ids=list(p), params=s, max_new_tokens=max_new)
                for i, (p, s) in enumerate(zip(prompts, params))]
    return [r.output_token_ids for r in run_to_completion(engine, requests)]


def test_tree_drafts_respect_topk_depth_and_budget():
    from specdec_cli.drafters.base import DraftRequest

    target = toy_model(0, vocab_size=VOCAB, num_layers=2)
    drafter = _tree_engine(target, topk=3, depth=3, nodes=7).drafter
    drafter.add_request(0, PROMPT)
    tree = drafter.propose_tree(DraftRequest(slot=0, token_ids=PROMPT), depth=3, max_nodes=7)
    assert len(tree.tokens) == 7 and max(tree.depths) <= 3
    assert all(p < i for i, p in enumerate(tree.parents))
    for parent in [-1, *range(7)]:
        assert sum(p == parent for p in tree.parents) <= 3
    assert all(token in DRAFT_IDS.tolist() for token in tree.tokens)  # d2t applied (target ids)


def test_the_confidence_stop_ends_a_tree_after_the_level_where_the_spine_is_unsure():
    from specdec_cli.drafters.base import DraftRequest

    target = toy_model(0, vocab_size=VOCAB, num_layers=2)
    depths = {}
    for confidence in (0.0, 0.5, 0.99):  # the toy head's top draft has probability ~0.94 at every level
        drafter = _tree_engine(target, topk=3, depth=3, nodes=8, confidence=confidence).drafter
        drafter.add_request(0, PROMPT)
        depths[confidence] = max(drafter.propose_tree(DraftRequest(slot=0, token_ids=PROMPT), 3, 8).depths)
    assert depths == {0.0: 3, 0.5: 3, 0.99: 1}
    # sampled: a tree stops after the level where its spine drew an unlikely token (q ~0.06), else grows on
    sampled_depths = {max(_sampled_tree(3, 3, 8, seed, confidence=0.5).depths) for seed in range(12)}
    assert {1, 3} <= sampled_depths, sampled_depths


def test_greedy_and_sampled_requests_get_their_own_node_budgets():
    """The auto tree's shape: 8 nodes for a greedy request, K + 1 for a sampled one, in one engine."""
    from specdec_cli.engine.request import SamplingParams

    target = toy_model(0, vocab_size=VOCAB, num_layers=2)
    engine = _tree_engine(target, topk=2, depth=3, nodes=8, sampled_nodes=4)
    budgets, sizes = {}, {}
    propose = engine.drafter.propose_tree

    def recorded(request, depth, max_nodes, params):
        tree = propose(request, depth, max_nodes, params)
        key = float(params.temperature[0])
        budgets.setdefault(key, set()).add(max_nodes)
        sizes[key] = max(sizes.get(key, 0), len(tree.tokens))
        return tree

    engine.drafter.propose_tree = recorded
    _generate(engine, [PROMPT, PROMPT], [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=3)],
              30)
    assert max(budgets[0.0]) == 8 and max(budgets[1.0]) == 4
    assert sizes[0.0] > 4 and 1 <= sizes[1.0] <= 4


@pytest.mark.parametrize(("confidence", "enhancer", "head_layers"), [(0.0, 0, 1), (0.95, 0, 1), (0.3, 2, 1), (0.0, 0, 2)])
def test_greedy_tree_equals_autoregressive_greedy(confidence, enhancer, head_layers):
    from specdec_cli.engine.engine import EngineOptions, SpecEngine
    from specdec_cli.engine.request import SamplingParams

    target = toy_model(0, vocab_size=VOCAB, num_layers=2)
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 6, 7], [9, 9, 9, 9, 9, 9, 3]]
    greedy = SamplingParams(temperature=0.0)
    engine = _tree_engine(target, confidence=confidence, enhancer_min_match=enhancer, head_layers=head_layers)
    tree_out = _generate(engine, prompts, greedy, 24)
    plain = SpecEngine(target, None, EngineOptions(max_batch_size=1, max_seq_len=96, prefill_chunk=5))
    assert tree_out == _generate(plain, prompts, greedy, 24)
    assert engine.stats.accepted_drafts > 0 and engine.stats.target_forwards < plain.stats.target_forwards
    assert not enhancer or engine.drafter.overridden > 0
    # the enhancer's retrieval chains may fill the node budget (8), deeper than the model's trees (depth 3)
    assert not enhancer or len(engine.stats.proposed_at) > 3


def _sampled_tree(topk: int, depth: int, nodes: int, seed: int, confidence: float = 0.0, **filters):
    from specdec_cli.drafters.base import DraftRequest
    from specdec_cli.engine.request import Request, SamplingParams
    from specdec_cli.sampling import BatchParams

    target = toy_model(0, vocab_size=VOCAB, num_layers=2)
    drafter = _tree_engine(target, topk=topk, depth=depth, nodes=nodes, confidence=confidence).drafter
    drafter.add_request(0, PROMPT)
    request = Request(id="0", prompt_token_ids=PROMPT, max_new_tokens=8,
                      params=SamplingParams(temperature=1.0, seed=seed, **filters))
    return drafter.propose_tree(DraftRequest(slot=0, token_ids=PROMPT), depth, nodes, BatchParams.of([request]))


def test_sampled_tree_draws_siblings_without_replacement_under_the_budget():
    tree = _sampled_tree(topk=3, depth=4, nodes=9, seed=5)
    num, draft_ids = len(tree.tokens), DRAFT_IDS.tolist()
    assert num == 9 and tree.draft_probs.shape == (num, len(draft_ids))
    assert all(p < i for i, p in enumerate(tree.parents))
    spine = [0]  # the chain's drafts: the root's first child, then each spine node's first child
    while any(p == spine[-1] for p in tree.parents):
        spine.append(tree.parents.index(spine[-1]))
    assert [tree.depths[i] for i in spine] == [1, 2, 3, 4]
    for parent in [-1, *range(num)]:
        siblings = [i for i in range(num) if tree.parents[i] == parent]
        columns = [draft_ids.index(tree.tokens[i]) for i in siblings]  # draft-vocabulary ids
        assert len(set(columns)) == len(columns) <= 3
        for j, node in enumerate(siblings):
            q = tree.draft_probs[node]
            assert float(q[columns[j]]) > 0  # drawn from q_j ...
            assert all(float(q[c]) == 0 for c in columns[:j])  # ... = q without the earlier siblings
            torch.testing.assert_close(q.sum(), torch.tensor(1.0))


def test_sampled_tree_is_reproducible_per_seed_and_respects_top_k():
    first, again, other = (_sampled_tree(4, 3, 8, seed) for seed in (7, 7, 8))
    assert first.tokens == again.tokens and first.parents == again.parents
    torch.testing.assert_close(first.draft_probs, again.draft_probs)
    assert first.tokens != other.tokens or first.parents != other.parents
    filtered = _sampled_tree(4, 3, 8, 3, top_k=2)  # q keeps two tokens: at most two children per node
    for parent in [-1, *range(len(filtered.tokens))]:
        assert sum(p == parent for p in filtered.parents) <= 2
    assert int((filtered.draft_probs > 0).sum(dim=-1).max()) <= 2


@pytest.mark.parametrize("topk, depth, nodes, top_k, confidence, enhancer, verification",
                         [(4, 2, 8, 0, 0.0, 0, "block"), (3, 3, 5, 6, 0.0, 0, "block"), (3, 3, 8, 0, 0.5, 0, "block"),
                          (3, 3, 8, 0, 0.3, 1, "block"), (3, 3, 8, 0, 0.0, 0, "token"), (3, 3, 8, 0, 0.5, 0, "token")],
                         ids=["wide", "budget_top_k", "confidence_stop", "suffix_enhancer", "node_by_node",
                              "node_by_node_confidence_stop"])
def test_sampled_tree_follows_the_target_law(topk, depth, nodes, top_k, confidence, enhancer, verification):
    """Traversal verification (the default) and node-by-node rejection of the engine's level-by-level trees."""
    from specdec_cli.engine.request import SamplingParams
    from specdec_cli.testing import exact_sequence_law
    from specdec_cli.verify.stats import check_three_token_law

    target = toy_model(0, vocab_size=VOCAB, num_layers=2)
    prompt, num = [3, 1, 4, 1, 5], 1500
    law = exact_sequence_law(target, prompt, 3, temperature=1.0, top_k=top_k)
    engine = _tree_engine(target, topk=topk, depth=depth, nodes=nodes, confidence=confidence,
                          enhancer_min_match=enhancer, verification=verification)
    samples = torch.tensor(_generate(engine, [prompt] * num,
                                     [SamplingParams(temperature=1.0, top_k=top_k, seed=i) for i in range(num)], 3))
    assert 0 < engine.stats.accepted_drafts < engine.stats.proposed_drafts
    assert not enhancer or engine.drafter.overridden > 0  # retrieval chains were verified too
    check_three_token_law(samples, law)
