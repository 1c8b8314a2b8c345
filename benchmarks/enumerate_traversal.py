"""Exact enumeration of one tree verification: traversal verification vs node-by-node tree rejection.

For random small instances (vocabulary V, random target and draft next-token laws for every prefix), every draft
tree the drafter can produce is enumerated with its probability, and each rule's outcome law is computed
analytically (its tests pass with probability w or min(1, p/q): no sampling). Printed per tree shape: the largest
deviation from exactness and the expected tokens emitted per verify step under each rule.

Exactness here: for every prefix s and token t, P(output extends s + t) = p(t | s) * P(output extends s
strictly), i.e. given that the output goes past s its next token follows the target; this is what makes
rounds of verification generate the target's sequence law.

Shapes: fixed trees (children drawn one after another without replacement, or the draft's top children), and
level-by-level trees like the engine's sampled ones: the first child of the previous level's first node always
gets a child, the other slots of a level go by cum q (known before drawing) across subtrees, and an optional
confidence stop ends the tree after a level whose first node's q is below a threshold.

    python benchmarks/enumerate_traversal.py [--vocab 3] [--instances 30]
"""
from __future__ import annotations

import argparse
import itertools

import numpy as np

Node = tuple[int, int, np.ndarray]  # (parent index or -1, token, the q it was drawn from)


class Laws:
    """Random next-token laws per prefix (some with an exact zero), drawn on first use."""

    def __init__(self, rng: np.random.Generator, vocab: int) -> None:
        self.rng, self.vocab, self.rows = rng, vocab, {}

    def __call__(self, prefix: tuple[int, ...]) -> np.ndarray:
        if prefix not in self.rows:
            row = self.rng.dirichlet([0.7] * self.vocab)
            if self.rng.random() < 0.2:
                row[self.rng.integers(self.vocab)] = 0.0
            self.rows[prefix] = row / row.sum()
        return self.rows[prefix]


def path_of(nodes: list[Node], i: int) -> tuple[int, ...]:
    out = []
    while i >= 0:
        out.append(nodes[i][1])
        i = nodes[i][0]
    return tuple(out[::-1])


def children(nodes: list[Node], parent: int) -> list[int]:
    return [i for i, node in enumerate(nodes) if node[0] == parent]


def outcome(nodes: list[Node], target: Laws, rule: str) -> dict[tuple[int, ...], float]:
    """The law of the emitted tokens for one drawn tree: ``traversal`` or ``token`` (node by node)."""
    law: dict[tuple[int, ...], float] = {}

    def finish(prefix: tuple[int, ...], row: np.ndarray, mass: float) -> None:
        for token in np.flatnonzero(row):
            law[prefix + (int(token),)] = law.get(prefix + (int(token),), 0.0) + mass * row[token]

    def token_walk(node: int, mass: float) -> None:
        prefix = path_of(nodes, node) if node >= 0 else ()
        row = target(prefix).copy()
        for child in children(nodes, node):
            token, q = nodes[child][1], nodes[child][2]
            accept = min(1.0, row[token] / q[token])
            if accept > 0:
                token_walk(child, mass * accept)
            mass *= 1 - accept
            left = np.maximum(row - q, 0)
            row = left / left.sum() if left.sum() > 0 else row
        finish(prefix, row, mass)

    def traverse(node: int, weight: float, mass: float) -> float:
        """Adds what passes at or below ``node``; returns the probability mass that fails it."""
        prefix = path_of(nodes, node) if node >= 0 else ()
        row = target(prefix).copy()
        for child in children(nodes, node):
            token, q = nodes[child][1], nodes[child][2]
            mass = traverse(child, min(1.0, weight * row[token] / q[token]), mass)
            left = np.maximum(weight * row - q, 0)
            mass_left = left.sum()
            if 1 - weight + mass_left > 0:
                weight = mass_left / (1 - weight + mass_left)
            row = left / mass_left if mass_left > 0 else row
        finish(prefix, row, mass * weight)
        return mass * (1 - weight)

    if rule == "token":
        token_walk(-1, 1.0)
    else:
        assert traverse(-1, 1.0, 1.0) < 1e-12  # the root never fails
    return law


def draw_children(nodes: list[Node], parent: int, count: int, draft: Laws, top: bool):
    """Yield (nodes with ``count`` more children of ``parent``, probability), drawn one after another without
    replacement (or the draft's top ones, probability 1)."""
    if count == 0:
        yield nodes, 1.0
        return
    row = draft(path_of(nodes, parent) if parent >= 0 else ()).copy()
    for taken in children(nodes, parent):
        row[nodes[taken][1]] = 0.0
    if row.sum() <= 0:
        yield nodes, 1.0
        return
    row /= row.sum()
    tokens = [int(np.argmax(row))] if top else [int(t) for t in np.flatnonzero(row)]
    for token in tokens:
        q = np.eye(len(row))[token] if top else row
        for more, prob in draw_children(nodes + [(parent, token, q)], parent, count - 1, draft, top):
            yield more, prob * (1.0 if top else row[token])


def fixed_trees(parents: list[int], draft: Laws, top: bool):
    """Every tree of shape ``parents`` (topological, siblings contiguous) with its probability."""
    def grow(nodes: list[Node], prob: float, at: int):
        if at == len(parents):
            yield nodes, prob
            return
        parent = parents[at]
        count = 1
        while at + count < len(parents) and parents[at + count] == parent:
            count += 1
        for more, p in draw_children(nodes, parent, count, draft, top):
            yield from grow(more, prob * p, at + count)
    yield from grow([], 1.0, 0)


def level_trees(slots: list[int], draft: Laws, stop_below: float):
    """Every level-by-level tree (see the module doc) with its probability; ``slots`` nodes per level."""
    def grow(nodes: list[Node], prob: float, level: int, frontier: list[int]):
        if level == len(slots):
            yield nodes, prob
            return
        if level == 0:
            plan = {-1: slots[0]}
        else:
            plan, scores = {frontier[0]: 1}, []
            for x in frontier:
                logcum = sum(np.log(n[2][n[1]]) for n in (nodes[i] for i in _ancestry(nodes, x)))
                ranked = np.sort(draft(path_of(nodes, x)))[::-1]
                scores += [(-(logcum + np.log(max(ranked[j], 1e-300))), frontier.index(x), j, x)
                           for j in range(len(ranked)) if not (x == frontier[0] and j == 0)]
            for _, _, j, x in sorted(scores):
                if sum(plan.values()) < slots[level] and plan.get(x, 0) == j:
                    plan[x] = j + 1
        parents_in_order = sorted(plan, key=lambda x: -1 if x < 0 else frontier.index(x))

        start = len(nodes)

        def expand(nodes, prob, k):
            if k == len(parents_in_order):
                new = list(range(start, len(nodes)))
                first = nodes[new[0]] if new else None
                if first is None or (stop_below and first[2][first[1]] < stop_below):
                    yield nodes, prob
                else:
                    yield from grow(nodes, prob, level + 1, new)
                return
            x = parents_in_order[k]
            for more, p in draw_children(nodes, x, plan[x], draft, top=False):
                yield from expand(more, prob * p, k + 1)
        yield from expand(nodes, prob, 0)
    yield from grow([], 1.0, 0, [])


def _ancestry(nodes: list[Node], i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(i)
        i = nodes[i][0]
    return out


def evaluate(trees, target: Laws, vocab: int) -> tuple[float, float, float]:
    """(max exactness deviation of traversal, expected tokens per step: traversal, node by node)."""
    laws = {"traversal": {}, "token": {}}
    for nodes, prob in trees:
        for rule, law in laws.items():
            for seq, p in outcome(nodes, target, rule).items():
                law[seq] = law.get(seq, 0.0) + prob * p
    worst = 0.0
    law = laws["traversal"]
    for length in range(max(map(len, law))):
        for prefix in itertools.product(range(vocab), repeat=length):
            through = sum(p for seq, p in law.items() if seq[:length] == prefix and len(seq) > length)
            for token in range(vocab):
                extends = sum(p for seq, p in law.items() if seq[:length + 1] == prefix + (token,))
                worst = max(worst, abs(extends - target(prefix)[token] * through))
    mean = {rule: sum(p * len(seq) for seq, p in law.items()) for rule, law in laws.items()}
    return worst, mean["traversal"], mean["token"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=3)
    parser.add_argument("--instances", type=int, default=30)
    args = parser.parse_args()
    shapes = [("chain of 3", lambda d: fixed_trees([-1, 0, 1], d, False)),
              ("2 root children, 1 grandchild", lambda d: fixed_trees([-1, -1, 0], d, False)),
              ("5 nodes, depth 3", lambda d: fixed_trees([-1, -1, 0, 0, 2], d, False)),
              ("5 nodes, depth 3, top children", lambda d: fixed_trees([-1, -1, 0, 0, 2], d, True)),
              ("level-by-level 2/2/2", lambda d: level_trees([2, 2, 2], d, 0.0)),
              ("level-by-level 2/3/2", lambda d: level_trees([2, 3, 2], d, 0.0)),
              ("level-by-level 2/2/2, confidence stop 0.45", lambda d: level_trees([2, 2, 2], d, 0.45))]
    print(f"V = {args.vocab}, {args.instances} random instances per shape\n")
    print("| tree | max deviation from exactness | tokens per step: traversal | node by node | gain | instances where "
          "traversal keeps fewer |")
    print("|---|---|---|---|---|---|")
    for name, trees in shapes:
        rng = np.random.default_rng(0)
        results = []
        for _ in range(args.instances):
            target, draft = Laws(rng, args.vocab), Laws(rng, args.vocab)
            results.append(evaluate(trees(draft), target, args.vocab))
        worst, traversal, token = np.max([r[0] for r in results]), *np.mean([r[1:] for r in results], axis=0)
        fewer = sum(r[1] < r[2] - 1e-12 for r in results)
        print(f"| {name} | {worst:.1e} | {traversal:.4f} | {token:.4f} | {traversal / token - 1:+.1%} | "
              f"{fewer} of {len(results)} |")


if __name__ == "__main__":
    main()
