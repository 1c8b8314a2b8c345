"""Tree acceptance: exact vectors for the greedy walk, and the emitted law equals the target's (chi-square +
TV) for deterministic and without-replacement siblings, over peaked, near-uniform and disjoint cases, on the
compiled CPU walk and the torch walk; the two walks emit the same tokens for the same uniforms (both rules;
traversal verification's own laws: test_sampling_traversal.py)."""
from __future__ import annotations

import pytest
import torch

from sampling_stats import assert_law
from specdec_cli.sampling import tree
from specdec_cli.sampling.tree import (
    draw_without_replacement,
    tree_accept,
    tree_depths,
    tree_greedy_accept,
    without_replacement_probs,
)

PARENTS = torch.tensor([-1, -1, -1, 0, 0, 1])  # three root children; two under node 0, one under node 1
VOCAB = 6
SAMPLES = 200_000


@pytest.fixture(params=["compiled", "torch"])
def walk(request, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test on the compiled CPU walk and on the torch walk (accelerators, or no numba)."""
    if request.param == "torch":
        monkeypatch.setattr(tree, "_cpu_kernel", lambda: None)
    else:
        assert tree._cpu_kernel() is not None
    return request.param


def test_depths_and_topological_order():
    assert tree_depths(PARENTS).tolist() == [1, 1, 1, 2, 2, 2]
    with pytest.raises(ValueError):
        tree_depths(torch.tensor([-1, 2, 0]))


def test_greedy_walk_follows_the_target_argmax():
    tokens, parents = [5, 7, 9, 3, 4, 8], PARENTS.tolist()
    # root argmax 7 (node 1), then 8 (node 5), then bonus 2
    assert tree_greedy_accept(tokens, parents, [7, 0, 8, 0, 0, 0, 2]) == ([7, 8, 2], [1, 5])
    # root argmax 5 (node 0), then 1: no child of node 0 matches
    assert tree_greedy_accept(tokens, parents, [5, 1, 0, 0, 0, 0, 0]) == ([5, 1], [0])
    assert tree_greedy_accept(tokens, parents, [6, 0, 0, 0, 0, 0, 0]) == ([6], [])


def test_one_hot_target_takes_the_argmax_path():
    node_tokens = torch.tensor([[1, 2, 3, 4, 5, 0]])
    targets = torch.zeros(1, 7, VOCAB)
    for row, token in enumerate([2, 0, 0, 4, 0, 0, 3]):  # root -> 2 (node 1) -> 0 (node 5) -> bonus 3
        targets[0, row, token] = 1.0
    tokens, emitted, path = tree_accept(targets, node_tokens, PARENTS)
    assert tokens.tolist() == [[2, 0, 3]] and emitted.tolist() == [3] and path.tolist() == [[1, 5]]


def _laws(case: str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(target first-token law [V], target law given the first token [V, V], draft laws alike)."""
    if case == "peaked":
        t1, t2 = torch.randn(VOCAB, generator=generator) * 3, torch.randn(VOCAB, VOCAB, generator=generator) * 3
        d1, d2 = t1 + torch.randn(VOCAB, generator=generator), t2 + torch.randn(VOCAB, VOCAB, generator=generator)
    elif case == "near_uniform":
        t1, t2 = torch.randn(VOCAB, generator=generator) * 0.1, torch.randn(VOCAB, VOCAB, generator=generator) * 0.1
        d1, d2 = torch.randn(VOCAB, generator=generator) * 0.1, torch.randn(VOCAB, VOCAB, generator=generator) * 0.1
    else:  # disjoint: the draft puts its mass where the target has none (and vice versa)
        half = torch.arange(VOCAB) < VOCAB // 2
        t1 = torch.where(half, 0.0, float("-inf")) + torch.randn(VOCAB, generator=generator)
        t2 = torch.where(half, 0.0, float("-inf")).expand(VOCAB, VOCAB) + torch.randn(VOCAB, VOCAB, generator=generator)
        d1 = torch.where(half, float("-inf"), 0.0) + torch.randn(VOCAB, generator=generator)
        d2 = torch.where(half, float("-inf"), 0.0).expand(VOCAB, VOCAB) + torch.randn(VOCAB, VOCAB, generator=generator)
    return t1.softmax(-1), t2.softmax(-1), d1.softmax(-1), d2.softmax(-1)


def _draw_children(probs: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """probs [B, V] -> [B, count] drawn without replacement, in draw order."""
    return torch.multinomial(probs, count, replacement=False, generator=generator)


@pytest.mark.parametrize("case", ["peaked", "near_uniform", "disjoint"])
@pytest.mark.parametrize("siblings", ["deterministic", "without_replacement"])
def test_two_token_law_equals_the_target(case, siblings, walk):
    generator = torch.Generator().manual_seed(len(case) * 7 + len(siblings))
    p1, p2, q1, q2 = _laws(case, generator)
    batch = SAMPLES
    if siblings == "deterministic":  # the draft's top children, the same in every row
        root = q1.topk(3).indices
        under0, under1 = q2[root[0]].topk(2).indices, q2[root[1]].topk(1).indices
        node_tokens = torch.cat([root, under0, under1]).expand(batch, -1).clone()
        node_draft_probs = None
    else:
        root = _draw_children(q1.expand(batch, -1), 3, generator)
        under0 = _draw_children(q2[root[:, 0]], 2, generator)
        under1 = _draw_children(q2[root[:, 1]], 1, generator)
        node_tokens = torch.cat([root, under0, under1], dim=1)
        node_draft_probs = torch.cat([without_replacement_probs(q1.expand(batch, -1), root),
                                      without_replacement_probs(q2[root[:, 0]], under0),
                                      q2[root[:, 1]][:, None]], dim=1)
    targets = torch.cat([p1.expand(batch, 1, -1), p2[node_tokens]], dim=1)  # row i + 1: after node i
    tokens, emitted, _ = tree_accept(targets, node_tokens, PARENTS, node_draft_probs, generator)
    assert int(emitted.min()) >= 1 and int(emitted.max()) <= 3
    first = tokens[:, 0]
    second = torch.where(emitted >= 2, tokens[:, 1], torch.multinomial(p2[first], 1, generator=generator)[:, 0])
    assert_law(first * VOCAB + second, (p1[:, None] * p2).flatten())


def test_draws_without_replacement_follow_the_sequential_law():
    generator = torch.Generator().manual_seed(11)
    q = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0, 0.0])
    ids = draw_without_replacement(q.expand(SAMPLES, -1), 2, generator)
    assert bool((ids[:, 0] != ids[:, 1]).all())
    pair_law = q[:, None] * q[None, :] / (1 - q[:, None])  # P(first a, then b) = q(a) q(b) / (1 - q(a))
    pair_law.fill_diagonal_(0.0)
    assert_law(ids[:, 0] * VOCAB + ids[:, 1], pair_law.flatten())
    # a row runs out of mass after its support: -1 from then on; seeded draws repeat
    few = draw_without_replacement(torch.tensor([[0.0, 0.7, 0.0, 0.3, 0.0, 0.0]]), 4, torch.Generator().manual_seed(1))
    assert sorted(few[0, :2].tolist()) == [1, 3] and few[0, 2:].tolist() == [-1, -1]
    again = draw_without_replacement(torch.tensor([[0.0, 0.7, 0.0, 0.3, 0.0, 0.0]]), 4, torch.Generator().manual_seed(1))
    assert torch.equal(few, again)


def _random_tree(num_nodes: int, generator: torch.Generator) -> torch.Tensor:
    """parents [N]: node i hangs under a random earlier node or the root."""
    return torch.tensor([int(torch.randint(-1, i, (), generator=generator)) for i in range(num_nodes)])


@pytest.mark.parametrize("vocab", [5, 300, 49_152])
@pytest.mark.parametrize("siblings", ["deterministic", "without_replacement"])
@pytest.mark.parametrize("verification", ["token", "block"])
def test_compiled_walk_emits_what_the_torch_walk_emits(vocab, siblings, verification, monkeypatch):
    """Same uniforms, same tokens / lengths / paths: chains, wide and random trees, peaked rows with exact
    zeros, drafts equal to the target (an empty residual) and nodes the target gives zero."""
    generator = torch.Generator().manual_seed(vocab + len(siblings))
    shapes = [torch.tensor([-1, 0, 1, 2]), torch.tensor([-1, -1, -1, -1]), torch.tensor([], dtype=torch.int64),
              *[_random_tree(n, generator) for n in (3, 7, 12)]]
    for parents in shapes:
        batch, nodes = 16, parents.numel()
        logits = 3 * torch.randn(batch, nodes + 1, vocab, generator=generator)
        logits[logits < -4] = -float("inf")
        target = logits.softmax(-1)
        draft = (logits[:, 1:] + torch.randn(batch, nodes, vocab, generator=generator)).softmax(-1)
        draft[::4] = target[::4, 1:]  # an empty residual after a rejection
        node_tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=generator).view(batch, nodes)
        if siblings == "deterministic":
            draft = None
            node_tokens = torch.randint(0, vocab, (batch, nodes), generator=generator)
        uniforms = torch.rand(batch, nodes + 1, generator=generator, dtype=torch.float64)
        compiled = tree_accept(target, node_tokens, parents, draft, uniforms=uniforms, verification=verification)
        with monkeypatch.context() as patch:
            patch.setattr(tree, "_cpu_kernel", lambda: None)
            reference = tree_accept(target, node_tokens, parents, draft, uniforms=uniforms, verification=verification)
        for got, expected in zip(compiled, reference):
            assert torch.equal(got, expected), parents.tolist()
