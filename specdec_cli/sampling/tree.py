"""Draft-tree acceptance: (a tree of drafts, the target's rows at its nodes) -> the emitted root-to-node path.

Tree layout (one per batch row): N draft nodes in topological order, ``parents[i]`` in -1..i-1 (-1: a child
of the root, the last committed token). Verify row 0 is the root and row i + 1 is node i, so
``target_probs[:, i + 1]`` is the target's distribution of the token that follows node i. Siblings are tried
in node order (give the most probable child the lowest index).

Algorithm (multi-candidate recursive rejection sampling; ``tree_accept``). At node x with target row p:
  for each child c_1, c_2, ... of x in order, with q_j the distribution c_j was drawn from *given* x and the
  earlier siblings c_1..c_{j-1} (``node_draft_probs``):
      accept c_j iff  u_j * q_j(c_j) < p(c_j)          (u_j uniform, float64; strict, so p(c_j) = 0 rejects)
      on acceptance: emit c_j, move to c_j with p = the target row at c_j, repeat;
      on rejection:  p <- normalize(max(p - q_j, 0)) and try the next sibling;
  when every child is rejected (or x is a leaf): emit one token drawn from p (the residual after the
  rejections, or the target row itself at a leaf: the bonus token) and stop.
Exactness: one sibling test is the Leviathan/Chen step with residual r = normalize(max(p - q_j, 0)):
P(emit t) = q_j(t) min(1, p(t)/q_j(t)) + (1 - sum_s min(p(s), q_j(s))) r(t) = p(t), provided c_j ~ q_j
independently of the u's. By induction over the siblings the token leaving x is distributed as p, and each
accepted child continues the same argument at the next depth, so the emitted sequence is distributed as the
target's autoregressive samples. Two sibling schemes satisfy the proviso:
  - deterministic children (e.g. the draft's top-k): q_j is one-hot at c_j (``node_draft_probs=None``); a
    sibling is accepted with probability p(c_j) / (mass left) and a rejected one is removed from p;
  - children drawn without replacement from a parent distribution q: q_j = q with c_1..c_{j-1} removed and
    renormalised (``without_replacement_probs``).
With a greedy target (one-hot p) both reduce to: follow the child equal to the target's argmax.

Traversal verification (``verification="block"``): the paths judged as a whole (``sampling.traversal``).

On CPU each walk is one compiled call per row (``cpu_tree``); on accelerators, or where numba cannot be
imported, the batched torch walks below.

Randomness (both rules): N + 1 float64 uniforms per row, u_j indexed by node (each node is tested at most once)
and the last for the final draw, so a row's stream advances by the same amount whatever the tree's outcome.
"""
from __future__ import annotations

import functools
from types import ModuleType
from typing import Optional

import torch

from specdec_cli.sampling.acceptance import PLACEHOLDER_TOKEN_ID
from specdec_cli.sampling.draws import Generators, draw_uniforms, inverse_cdf
from specdec_cli.sampling.probs import SamplingError
from specdec_cli.sampling.traversal import depth_first_events, traversal_walk


def tree_depths(parents: torch.Tensor) -> torch.Tensor:
    """parents [N] int64 (-1 = root, topological) -> depth of each node [N] (children of the root: 1)."""
    depths: list[int] = []
    for i, parent in enumerate(parents.tolist()):
        if not -1 <= parent < i:
            raise SamplingError(f"parents[{i}]={parent} must be in -1..{i - 1} (topological order)")
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return torch.tensor(depths, dtype=torch.int64)


def tree_greedy_accept(node_tokens: list[int], parents: list[int], target_tokens: list[int]) -> tuple[list[int], list[int]]:
    """Greedy tree acceptance: node_tokens [N], parents [N], target_tokens [N+1] (the target's argmax at the
    root and after each node) -> (emitted tokens: the longest matching path's tokens + the target's token
    after it, accepted node indices). Of several children matching, the first in node order is taken."""
    emitted, path, row = [], [], 0
    while True:
        wanted = target_tokens[row]
        match = next((i for i, (t, p) in enumerate(zip(node_tokens, parents)) if p == row - 1 and t == wanted), None)
        emitted.append(wanted)
        if match is None:
            return emitted, path
        path.append(match)
        row = match + 1


def without_replacement_probs(parent_probs: torch.Tensor, siblings: torch.Tensor) -> torch.Tensor:
    """parent_probs [B, V], siblings [B, S] drawn one after another without replacement -> q_j [B, S, V]:
    the distribution sibling j was drawn from (parent_probs without siblings 0..j-1, renormalised)."""
    num = siblings.shape[1]
    removed = torch.zeros(siblings.shape[0], num, parent_probs.shape[-1], dtype=torch.bool, device=siblings.device)
    for j in range(1, num):
        removed[:, j:].scatter_(-1, siblings[:, j - 1, None, None].expand(-1, num - j, 1), True)
    rows = parent_probs.double()[:, None].masked_fill(removed, 0.0)
    return (rows / rows.sum(dim=-1, keepdim=True)).to(parent_probs.dtype)


def draw_without_replacement(probs: torch.Tensor, num: int, generators: Generators = None) -> torch.Tensor:
    """probs [W, V] -> ids [W, num] int64: each row's ``num`` draws one after another, draw j from the row
    without draws 0..j-1 (renormalised; the q_j of ``without_replacement_probs``), by inverse CDF with one
    float64 uniform per row and draw from ``generators``; -1 once a row has no mass left."""
    remaining = probs.double().clone()
    ids = torch.full((probs.shape[0], num), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=probs.device)
    for j in range(num):
        has_mass = remaining.sum(dim=-1) > 0
        token = inverse_cdf(remaining, draw_uniforms((), generators, num_rows=probs.shape[0], device=probs.device))
        ids[:, j] = torch.where(has_mass, token, ids[:, j])
        remaining.scatter_(1, token[:, None], 0.0)
    return ids


def tree_accept(
    target_probs: torch.Tensor,
    node_tokens: torch.Tensor,
    parents: torch.Tensor,
    node_draft_probs: Optional[torch.Tensor] = None,
    generators: Generators = None,
    *,
    uniforms: Optional[torch.Tensor] = None,
    verification: str = "token",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless tree acceptance (see the module doc), vectorised over B rows that share one tree shape.

    target_probs [B, N+1, V]; node_tokens [B, N] int64 target ids; parents [N] int64; node_draft_probs
    [B, N, V] (q_j of each node) or None (one-hot: deterministic children); uniforms [B, N+1] float64 or
    drawn from ``generators``; verification "token" (recursive rejection, node by node) or "block" (traversal
    verification) -> (tokens [B, D+1] int64 padded with -1, num_emitted [B] in 1..D+1, path [B, D] accepted
    node indices padded with -1), D the tree's depth.
    """
    batch, rows, vocab = target_probs.shape
    num_nodes = rows - 1
    if node_tokens.shape != (batch, num_nodes) or parents.shape != (num_nodes,):
        raise SamplingError(f"need target_probs [B, N+1, V], node_tokens [B, N], parents [N]; got "
                            f"{tuple(target_probs.shape)}, {tuple(node_tokens.shape)}, {tuple(parents.shape)}")
    if node_draft_probs is not None and node_draft_probs.shape != (batch, num_nodes, vocab):
        raise SamplingError(f"node_draft_probs must be [{batch}, {num_nodes}, {vocab}]")
    device = target_probs.device
    levels = tree_depths(parents)
    depth = int(levels.max()) if num_nodes else 0
    if uniforms is None:
        uniforms = draw_uniforms((num_nodes + 1,), generators, num_rows=batch, device=device)
    uniforms = uniforms.to(device, torch.float64)
    if verification not in ("token", "block"):
        raise SamplingError(f"verification must be token or block, got {verification!r}")
    kernel = _cpu_kernel()
    if verification == "block":
        events = depth_first_events(parents.tolist())
        if kernel is not None and kernel.usable(target_probs, node_draft_probs):
            return kernel.traversal_walk(target_probs, node_tokens, parents.cpu(), node_draft_probs, uniforms,
                                         events, levels)
        return traversal_walk(target_probs, node_tokens, parents, node_draft_probs, uniforms, events, levels)
    if kernel is not None and kernel.usable(target_probs, node_draft_probs):
        return kernel.tree_walk(target_probs, node_tokens, parents.cpu(), node_draft_probs, uniforms, depth)
    children = [[i for i, p in enumerate(parents.tolist()) if p == row - 1] for row in range(rows)]
    index = torch.arange(batch, device=device)
    tokens = torch.full((batch, depth + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    path = torch.full((batch, depth), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    row = torch.zeros(batch, dtype=torch.int64, device=device)  # current verify row (0: root)
    live = torch.ones(batch, dtype=torch.bool, device=device)  # still descending
    emitted = torch.zeros(batch, dtype=torch.int64, device=device)
    for level in range(depth + 1):
        residual = target_probs[index, row].double()
        accepted = torch.full((batch,), -1, dtype=torch.int64, device=device)
        for rank in range(max(len(c) for c in children)):
            # the rank-th child of each row's current node, where it has one and nothing was accepted yet
            child = torch.tensor([c[rank] if rank < len(c) else -1 for c in children], device=device)[row]
            trying = live & (accepted < 0) & (child >= 0)
            if not bool(trying.any()):
                continue
            node = child.clamp(min=0)
            token = node_tokens[index, node]
            if node_draft_probs is None:
                draft = torch.nn.functional.one_hot(token, vocab).double()
            else:
                draft = node_draft_probs[index, node].double()
            p_at, q_at = residual.gather(1, token[:, None])[:, 0], draft.gather(1, token[:, None])[:, 0]
            passed = trying & (uniforms[index, node] * q_at < p_at)
            accepted = torch.where(passed, node, accepted)
            rejected = (trying & ~passed)[:, None]
            leftover = (residual - draft).clamp_(min=0)
            mass = leftover.sum(dim=-1, keepdim=True)
            residual = torch.where(rejected & (mass > 0), leftover / mass.clamp(min=1e-300), residual)
        stop = live & (accepted < 0)
        if bool(stop.any()):
            final = inverse_cdf(residual, uniforms[:, num_nodes])
            tokens[stop, level] = final[stop]
            emitted = torch.where(stop, level + 1, emitted)
        go = live & (accepted >= 0)
        if level < depth:
            tokens[go, level] = node_tokens[index, accepted.clamp(min=0)][go]
            path[go, level] = accepted[go]
        row = torch.where(go, accepted + 1, row)
        live = go
    return tokens, emitted, path


@functools.cache
def _cpu_kernel() -> Optional[ModuleType]:
    """The compiled CPU walk (``cpu_tree``), or None where numba cannot be imported."""
    try:
        from specdec_cli.sampling import cpu_tree
    except ImportError:
        return None
    return cpu_tree
