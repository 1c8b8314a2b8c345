"""Traversal verification of draft trees (``tree_accept(verification="block")``): what rounds of it emit follow the
target's sequence law, it keeps more drafts than node-by-node tree rejection, and on a chain it is block
verification.

Like block verification it is exact over the generated sequence, so these tests run rounds on a Markov target and
draft (next-token laws depend on the previous token) and check the joint law of the first ``LENGTH`` generated
tokens (V ** LENGTH cells, chi-square + TV). Trees are drawn here with torch.multinomial (siblings one after
another without replacement, or the draft's top children), independently of the code under test; the dynamic
trees' shapes depend on drafted tokens in other subtrees and on a confidence stop, as the engine's level-by-level
trees do.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from sampling_stats import assert_law

from specdec_cli.sampling import block_verify, tree
from specdec_cli.sampling.tree import depth_first_events, tree_accept, without_replacement_probs

VOCAB, LENGTH, ROWS = 5, 3, 200_000
FIXED = [-1, -1, 0, 0, 1, 2, 2]  # two root children; two under node 0, one under node 1; two under node 2


@pytest.fixture(params=["compiled", "torch"])
def walk(request, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "torch":
        monkeypatch.setattr(tree, "_cpu_kernel", lambda: None)
    return request.param


def markov_laws(case: str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(target [V + 1, V], draft [V + 1, V]): row s is the next-token law after token s (row V: the start)."""
    def rows(scale: float) -> torch.Tensor:
        return (scale * torch.randn(VOCAB + 1, VOCAB, generator=generator)).softmax(-1)

    target, draft = rows(1.5), rows(1.5)
    if case == "zeros":  # the target rules out a token the draft proposes, and the other way round
        target[:, 0], draft[:, 1] = 0, 0
        target, draft = target / target.sum(-1, keepdim=True), draft / draft.sum(-1, keepdim=True)
    return target, draft


def draw_tree(parents: list[int], last: torch.Tensor, draft: torch.Tensor, siblings: str, generator: torch.Generator
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's tree of shape ``parents`` under its last token -> (node_tokens [B, N], node_draft_probs [B, N, V]
    or None for the draft's top children)."""
    tokens = torch.zeros(last.shape[0], len(parents), dtype=torch.int64)
    probs = torch.zeros(last.shape[0], len(parents), VOCAB)
    for parent in range(-1, len(parents)):
        kids = [i for i, p in enumerate(parents) if p == parent]
        if not kids:
            continue
        rows = draft[last if parent < 0 else tokens[:, parent]]
        if siblings == "deterministic":
            tokens[:, kids] = rows.topk(len(kids), dim=-1).indices
        else:
            tokens[:, kids] = torch.multinomial(rows, len(kids), replacement=False, generator=generator)
            probs[:, kids] = without_replacement_probs(rows, tokens[:, kids])
    return tokens, None if siblings == "deterministic" else probs


def dynamic_trees(last: torch.Tensor, draft: torch.Tensor, generator: torch.Generator
                  ) -> list[tuple[torch.Tensor, list[int], torch.Tensor, torch.Tensor]]:
    """Level-by-level trees: the root's two children; stop there when the first child's q is below 0.3; else node 0
    gets a child and the other level-2 slot goes to node 0 or node 1 by cum q (known before drawing), and node 0's
    first child gets a child -> [(rows, parents, node_tokens, node_draft_probs)] per shape."""
    shapes = {"stop": [-1, -1], "under0": [-1, -1, 0, 0, 2], "under1": [-1, -1, 0, 1, 2]}
    drawn, probs = draw_tree([-1, -1, 0, 0, 1, 2], last, draft, "without_replacement", generator)
    root_q = draft[last]
    first = root_q.gather(1, drawn[:, :1])[:, 0]
    second_best_under0 = draft[drawn[:, 0]].sort(dim=-1, descending=True).values[:, 1]
    best_under1 = draft[drawn[:, 1]].amax(dim=-1)
    to_node0 = first * second_best_under0 >= root_q.gather(1, drawn[:, 1:2])[:, 0] * best_under1
    columns = {"stop": [0, 1], "under0": [0, 1, 2, 3, 5], "under1": [0, 1, 2, 4, 5]}
    groups = []
    for name, rows in (("stop", first < 0.3), ("under0", (first >= 0.3) & to_node0),
                       ("under1", (first >= 0.3) & ~to_node0)):
        index = rows.nonzero()[:, 0]
        if index.numel():
            cols = columns[name]
            groups.append((index, shapes[name], drawn[index][:, cols], probs[index][:, cols]))
    return groups


def generate(target: torch.Tensor, draft: torch.Tensor, trees, generator: torch.Generator, verification: str,
             uniform_seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rounds of (draw each row's tree, verify) until every row has LENGTH tokens -> (the first LENGTH tokens
    [ROWS, LENGTH], tokens emitted by the first round [ROWS]). ``trees(last)`` -> [(rows, parents, node_tokens,
    node_draft_probs)]."""
    out = torch.full((ROWS, LENGTH + 8), -1, dtype=torch.int64)
    filled = torch.zeros(ROWS, dtype=torch.int64)
    last = torch.full((ROWS,), VOCAB, dtype=torch.int64)
    uniform_gen = torch.Generator().manual_seed(uniform_seed)
    first_round = None
    while bool((filled < LENGTH).any()):
        emitted_now, active = torch.zeros(ROWS, dtype=torch.int64), filled < LENGTH
        for rows, parents, node_tokens, node_probs in trees(last):
            targets = torch.cat([target[last[rows]][:, None], target[node_tokens]], dim=1)
            uniforms = torch.rand(rows.numel(), len(parents) + 1, generator=uniform_gen, dtype=torch.float64)
            tokens, emitted, _ = tree_accept(targets, node_tokens, torch.tensor(parents), node_probs,
                                             uniforms=uniforms, verification=verification)
            for j in range(tokens.shape[1]):
                write = (emitted > j) & active[rows]
                out[rows[write], filled[rows[write]] + j] = tokens[write, j]
            last[rows] = tokens.gather(1, (emitted - 1)[:, None])[:, 0]
            emitted_now[rows] = emitted
        filled += emitted_now
        first_round = emitted_now if first_round is None else first_round
    return out[:, :LENGTH], first_round


def sequence_law(target: torch.Tensor) -> np.ndarray:
    """The target's law of the first LENGTH tokens from the start state [V ** LENGTH]."""
    law = np.zeros(VOCAB ** LENGTH)
    rows = target.double().numpy()
    for cell, seq in enumerate(itertools.product(range(VOCAB), repeat=LENGTH)):
        state, prob = VOCAB, 1.0
        for token in seq:
            prob, state = prob * rows[state, token], token
        law[cell] = prob
    return law


def _cells(tokens: torch.Tensor) -> torch.Tensor:
    return sum(tokens[:, i] * VOCAB ** (LENGTH - 1 - i) for i in range(LENGTH))


@pytest.mark.parametrize("case", ["peaked", "zeros"])
@pytest.mark.parametrize("siblings", ["without_replacement", "deterministic"])
def test_traversal_generates_the_target_sequence_law(case, siblings, walk):
    generator = torch.Generator().manual_seed(len(case) * 13 + len(siblings))
    target, draft = markov_laws(case, generator)
    rows = torch.arange(ROWS)

    def trees(last):
        return [(rows, FIXED, *draw_tree(FIXED, last, draft, siblings, generator))]

    tokens, _ = generate(target, draft, trees, generator, "block")
    assert_law(_cells(tokens), sequence_law(target))


@pytest.mark.parametrize("case", ["peaked", "zeros"])
def test_traversal_of_dynamic_trees_generates_the_target_sequence_law(case, walk):
    generator = torch.Generator().manual_seed(len(case) * 17)
    target, draft = markov_laws(case, generator)
    tokens, _ = generate(target, draft, lambda last: dynamic_trees(last, draft, generator), generator, "block")
    assert_law(_cells(tokens), sequence_law(target))


def test_traversal_keeps_more_drafts_than_node_by_node_rejection():
    """Same trees, same uniforms: the first round emits more tokens on average, by more than 5 standard errors
    of the paired difference (for a fixed shape its expectation is at least the node-by-node rule's)."""
    generator = torch.Generator().manual_seed(5)
    target, draft = markov_laws("peaked", generator)
    last = torch.full((ROWS,), VOCAB, dtype=torch.int64)
    node_tokens, node_probs = draw_tree(FIXED, last, draft, "without_replacement", generator)
    targets = torch.cat([target[last][:, None], target[node_tokens]], dim=1)
    uniforms = torch.rand(ROWS, len(FIXED) + 1, generator=generator, dtype=torch.float64)
    emitted = {rule: tree_accept(targets, node_tokens, torch.tensor(FIXED), node_probs, uniforms=uniforms,
                                 verification=rule)[1].double() for rule in ("block", "token")}
    difference = emitted["block"] - emitted["token"]
    assert float(difference.mean()) > 5 * float(difference.std()) / ROWS ** 0.5


def test_on_a_chain_it_is_block_verification():
    generator = torch.Generator().manual_seed(3)
    batch, k, vocab = 4096, 4, 50
    logits = 2 * torch.randn(batch, k + 1, vocab, generator=generator)
    target = logits.softmax(-1)
    draft = (logits[:, :k] + torch.randn(batch, k, vocab, generator=generator)).softmax(-1)
    drafts = torch.multinomial(draft.reshape(-1, vocab), 1, generator=generator).view(batch, k)
    uniforms = torch.rand(batch, k + 1, generator=generator, dtype=torch.float64)
    chain_tokens, chain_emitted = block_verify(target, draft, drafts, uniforms=uniforms)
    tokens, emitted, path = tree_accept(target, drafts, torch.arange(-1, k - 1), draft, uniforms=uniforms,
                                        verification="block")
    assert torch.equal(emitted, chain_emitted)
    assert torch.equal(tokens, chain_tokens)
    assert torch.equal(path, torch.where(torch.arange(k) < (emitted - 1)[:, None], torch.arange(k), -1))


def test_one_hot_target_takes_the_argmax_path(walk):
    parents = torch.tensor([-1, -1, -1, 0, 0, 1])
    node_tokens = torch.tensor([[1, 2, 3, 4, 5, 0]])
    targets = torch.zeros(1, 7, 6)
    for row, token in enumerate([2, 0, 0, 4, 0, 0, 3]):  # root -> 2 (node 1) -> 0 (node 5) -> bonus 3
        targets[0, row, token] = 1.0
    draft = torch.full((1, 6, 6), 1 / 6)
    for probs in (None, draft):
        tokens, emitted, path = tree_accept(targets, node_tokens, parents, probs, verification="block")
        assert tokens.tolist() == [[2, 0, 3]] and emitted.tolist() == [3] and path.tolist() == [[1, 5]]


def test_depth_first_events_leave_children_before_their_parent():
    assert depth_first_events([-1, -1, 0, 0, 1]) == [0, 2, -3, 3, -4, -1, 1, 4, -5, -2]
    assert depth_first_events([]) == []
