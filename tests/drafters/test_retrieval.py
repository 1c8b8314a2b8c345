"""n-gram and suffix-automaton drafters: proposals on hand-made sequences."""
from __future__ import annotations

import random

from specdec_cli.config.schema import NgramMethodConfig, SuffixMethodConfig
from specdec_cli.drafters.base import DraftRequest
from specdec_cli.drafters.ngram import NgramDrafter, find_ngram_continuation
from specdec_cli.drafters.suffix import SuffixAutomaton, SuffixDrafter
from toys import batch_params


def _request(tokens: list[int], slot: int = 0) -> DraftRequest:
    return DraftRequest(slot=slot, token_ids=tokens)


def test_ngram_longest_match_earliest_occurrence() -> None:
    seq = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # suffix [2, 3] occurs at 1 and 5; earliest wins -> continuation after index 2
    assert find_ngram_continuation(seq, 2, 4, 3) == [9, 1, 2]
    # a longer n (3) wins when it matches: suffix [1, 2, 3] at 0 and 4
    assert find_ngram_continuation([1, 2, 3, 9, 1, 2, 3], 2, 4, 2) == [9, 1]


def test_ngram_no_match_and_min_n() -> None:
    assert find_ngram_continuation([1, 2, 3, 4], 2, 4, 3) == []
    assert find_ngram_continuation([5, 1, 6, 1], 2, 3, 3) == []  # only a 1-gram repeats
    assert find_ngram_continuation([5, 1, 6, 1], 1, 3, 3) == [6, 1]


def test_ngram_drafter_pads_and_counts() -> None:
    drafter = NgramDrafter(NgramMethodConfig(min_n=2, max_n=3), vocab_size=50)
    requests = [_request([1, 2, 3, 1, 2]), _request([4, 5, 6], slot=1)]
    proposal = drafter.propose(requests, k=4, params=batch_params(2, 0.0))
    assert proposal.num_drafts == [3, 0]
    assert proposal.tokens[0, :3].tolist() == [3, 1, 2]
    assert proposal.draft_probs is None  # one-hot q


def _brute_longest_earlier_suffix(seq: list[int]) -> int:
    for length in range(len(seq) - 1, 0, -1):
        suffix = seq[-length:]
        if any(seq[i : i + length] == suffix for i in range(len(seq) - length)):
            return length
    return 0


def test_suffix_automaton_matches_brute_force() -> None:
    rng = random.Random(0)
    for _ in range(200):
        seq = [rng.randrange(3) for _ in range(rng.randrange(1, 30))]
        automaton = SuffixAutomaton()
        for token in seq:
            automaton.extend(token)
        length, end = automaton.self_match()
        assert length == _brute_longest_earlier_suffix(seq)
        if length:
            assert seq[end - length + 1 : end + 1] == seq[-length:]
            assert end < len(seq) - 1


def test_suffix_drafter_local_and_global_pool() -> None:
    drafter = SuffixDrafter(SuffixMethodConfig(use_global_pool=True, min_match_len=2), vocab_size=50)
    drafter.add_request(0, [])
    proposal = drafter.propose([_request([7, 8, 9, 7, 8])], k=2, params=batch_params(1, 0.0))
    assert proposal.tokens[0].tolist() == [9, 7]
    drafter.remove_request(0, [10, 11, 12, 13, 14])
    drafter.add_request(1, [])
    proposal = drafter.propose([_request([1, 10, 11, 12], slot=1)], k=4, params=batch_params(1, 0.0))
    # the pool's copy of the finished request continues with 13, 14 and stops at its end
    assert proposal.num_drafts == [2]
    assert proposal.tokens[0, :2].tolist() == [13, 14]
