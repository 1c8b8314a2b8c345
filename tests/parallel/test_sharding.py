"""Sharding and the gather policy, in one process: ranks are threads exchanging through a board.

``ThreadComm`` replaces the process group's all-gather with a shared list and a barrier, so a
tensor-parallel forward runs on N threads without spawning processes.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import pytest
import torch

from specdec_cli.parallel.comm import Comm
from specdec_cli.parallel.gather import GatherPolicy, draft_gather_policy, gather_logits
from specdec_cli.parallel.partition import Shard, head_shards, split_sizes
from specdec_cli.parallel.shard import shard_transformer, should_shard_draft
from specdec_cli.testing import toy_arch, toy_model

T = TypeVar("T")


class ThreadComm(Comm):
    """Rank ``rank`` of ``size`` threads; all-gather goes through ``board`` (all-reduce too, for size 2)."""

    def __init__(self, rank: int, size: int, board: list, barrier: threading.Barrier) -> None:
        super().__init__(rank, size)
        self.board, self.barrier = board, barrier

    def all_reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 2:  # the library all-reduce: a + b on both ranks
            self.counts["all_reduce"] += 1
            parts = self._all_gather(x)
            return x.copy_(parts[0] + parts[1])
        return super().all_reduce_sum(x)

    def _all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        self.board[self.rank] = x.clone()
        self.barrier.wait()
        parts = list(self.board)
        self.barrier.wait()
        return parts


def on_ranks(size: int, fn: Callable[[Comm], T]) -> list[T]:
    """``fn(comm)`` on ``size`` thread-ranks at once; the results in rank order."""
    board, barrier = [None] * size, threading.Barrier(size)
    with ThreadPoolExecutor(size) as pool:
        futures = [pool.submit(fn, ThreadComm(rank, size, board, barrier)) for rank in range(size)]
        return [future.result(timeout=60) for future in futures]


def test_uneven_splits_follow_gqa_groups() -> None:
    assert split_sizes(35, 2) == (18, 17) and split_sizes(4, 3) == (2, 1, 1)
    shard = Shard.even(35, 2, 1)
    assert (shard.start, shard.end, shard.size, shard.total) == (18, 35, 17, 35)
    smollm = toy_arch(num_heads=9, num_kv_heads=3, hidden_size=72)  # SmolLM2-135M's head layout
    first, second = head_shards(smollm, 2, 0), head_shards(smollm, 2, 1)
    assert (first.kv.size, first.q.size, second.kv.size, second.q.size) == (2, 6, 1, 3)
    assert second.q.start == 6


def test_gather_policy() -> None:
    assert draft_gather_policy(tp_size=2, replicated=False, greedy=True) is GatherPolicy.ARGMAX_PAIRS
    assert draft_gather_policy(tp_size=2, replicated=False, greedy=False) is GatherPolicy.ALL_LOGITS
    for greedy in (True, False):  # a replicated (e.g. reduced-vocabulary EAGLE-3) head is never gathered
        assert draft_gather_policy(tp_size=2, replicated=True, greedy=greedy) is GatherPolicy.NONE
        assert draft_gather_policy(tp_size=1, replicated=False, greedy=greedy) is GatherPolicy.NONE


def test_a_replicated_head_is_never_gathered() -> None:
    comm = Comm(rank=0, size=2)  # no process group: any collective would fail
    shard = Shard.even(24, 2, 0)  # the head's own (reduced) vocabulary, not the target's
    logits = torch.randn(3, 24)
    assert gather_logits(logits, shard, GatherPolicy.NONE, comm, label="draft") is logits
    assert not comm.counts
    with pytest.raises(ValueError, match="needs a gather policy"):
        gather_logits(logits[:, :12], shard, GatherPolicy.NONE, comm, label="draft")


@pytest.mark.parametrize("size", [2, 3])
def test_gathered_logits_equal_the_whole_row(size: int) -> None:
    whole = torch.randn(4, 35)
    whole[1, 3] = whole[1, 30] = whole[1].max() + 1  # a tie across shards: the lowest id wins
    whole[2] = 0.0  # every entry ties

    def gather(comm: Comm) -> tuple[torch.Tensor, torch.Tensor, dict]:
        shard = Shard.even(35, comm.size, comm.rank)
        local = whole[:, shard.start : shard.end]
        every = gather_logits(local, shard, GatherPolicy.ALL_LOGITS, comm, label="draft")
        pairs = gather_logits(local, shard, GatherPolicy.ARGMAX_PAIRS, comm, label="draft")
        return every, pairs, dict(comm.counts)

    for every, pairs, counts in on_ranks(size, gather):
        assert torch.equal(every, whole)
        assert torch.equal(pairs.argmax(-1), whole.argmax(-1))
        assert torch.equal(pairs.max(-1).values, whole.max(-1).values)
        assert int(torch.isfinite(pairs).sum()) == whole.shape[0]  # only the winners survive
        assert counts == {"draft.all_logits": 1, "draft.argmax_pairs": 1}


@pytest.mark.parametrize("size", [2, 3])
def test_a_sharded_model_computes_the_whole_models_logits(size: int) -> None:
    arch = dict(vocab_size=35, num_layers=2, hidden_size=48, num_heads=6, num_kv_heads=3)
    whole = toy_model(0, **arch)
    prompts = [torch.tensor([1, 5, 9, 2, 7]), torch.tensor([3, 3, 4])]
    expected = whole(whole.new_cache(2, 16), [0, 1], prompts).logits

    def forward(comm: Comm) -> tuple[torch.Tensor, int]:
        model = toy_model(0, **arch)
        shard_transformer(model, comm, policy=GatherPolicy.ALL_LOGITS, label="target")
        cache = model.new_cache(2, 16)
        return model(cache, [0, 1], prompts).logits, cache.k.shape[2]

    ranks = on_ranks(size, forward)
    for logits, _ in ranks:
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert tuple(kv_heads for _, kv_heads in ranks) == split_sizes(3, size)  # rank-local caches


def test_separate_draft_rule() -> None:
    small = toy_model(0, num_heads=4, num_kv_heads=2)
    assert not should_shard_draft(small, 2)  # far below SHARD_DRAFT_MIN_PARAMS: replicated
    assert should_shard_draft(small, 2, min_params=0)
    assert not should_shard_draft(small, 4, min_params=0)  # 2 KV heads cannot be split 4 ways
