"""Tree verification on the target: one tree-masked forward equals running each root-to-leaf path on its own,
and the KV compaction keeps exactly the accepted path's entries."""
from __future__ import annotations

import torch

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


@torch.inference_mode()
def test_tree_forward_equals_every_path_alone():
    model = toy_model(3, vocab_size=32, num_layers=2)
    cache = model.new_cache(2, 64)
    model(cache, [0], torch.tensor(PROMPT))
    start = cache.length(0)
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
    model = toy_model(3, vocab_size=32, num_layers=2)
    cache = model.new_cache(2, 64)
    model(cache, [0], torch.tensor(PROMPT))
    start = cache.length(0)
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
