"""The suffix enhancer over every model drafter: where the request's own text repeats, its drafts are the
retrieval continuation with a one-hot q (in the draft vocabulary, also under d2t); the output stays the
target's (greedy: identical; T > 0: its law, rejection sampling on)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from adaptive_toys import K, METHODS, law_check, skipping_engine
from specdec_cli.drafters.base import DraftRequest
from specdec_cli.drafters.enhancer import SuffixEnhancer, draft_ids_of
from specdec_cli.engine.adaptive import SkipRule
from toy_engine import GREEDY, PROMPTS, generate, make_engine
from toys import DRAFT_IDS, VOCAB, batch_params, build

REPEATING = [1, 2, 3, 4, 5, 6, 1, 2, 3]  # suffix [1, 2, 3] occurred before: continuation [4, 5, 6, 1]
FRESH = [7, 0, 9, 11, 14, 2]  # no repeated suffix


def enhanced(name: str, min_match: int = 2, **options):
    return dataclasses.replace(METHODS[name], suffix_enhancer=True, suffix_min_match=min_match, **options)


@pytest.mark.parametrize("name", list(METHODS))
def test_a_long_enough_match_overrides_the_model(target, name: str) -> None:
    drafter = build(target, enhanced(name, min_match=3), 2)
    assert isinstance(drafter, SuffixEnhancer)
    for slot, context in enumerate([REPEATING, FRESH]):
        drafter.add_request(slot, context)
    requests = [DraftRequest(slot=s, token_ids=list(c)) for s, c in enumerate([REPEATING, FRESH])]
    proposal = drafter.propose(requests, K, batch_params(2, 1.0))
    lookup = draft_ids_of(drafter.d2t, drafter.draft_vocab_size, VOCAB)
    continuation = [4, 5, 6, 1]
    if name == "eagle3":  # 4 and 7 are outside the reduced draft vocabulary: the override ends before them
        assert lookup[4] < 0
        continuation = []
    if continuation:
        assert proposal.num_drafts[0] == len(continuation)
        assert proposal.tokens[0, : len(continuation)].tolist() == continuation
        one_hot = torch.zeros(len(continuation), drafter.draft_vocab_size)
        one_hot[torch.arange(len(continuation)), lookup[torch.tensor(continuation)]] = 1.0
        assert torch.equal(proposal.draft_probs[0, : len(continuation)], one_hot)
    assert drafter.overridden == (1 if continuation else 0)
    fresh_q = proposal.draft_probs[1, : proposal.num_drafts[1]]
    assert proposal.num_drafts[1] >= 1 and torch.allclose(fresh_q.sum(-1), torch.ones(len(fresh_q)))


def test_the_override_stops_at_a_token_outside_the_draft_vocabulary(target) -> None:
    drafter = build(target, enhanced("eagle3", min_match=2), 1)
    context = [0, 1, 2, 5, 4, 0, 1, 2]  # continuation [5, 4, 0, 1]: 4 is not in the draft vocabulary
    assert 4 not in DRAFT_IDS.tolist() and 5 in DRAFT_IDS.tolist()
    drafter.add_request(0, context)
    proposal = drafter.propose([DraftRequest(slot=0, token_ids=context)], K, batch_params(1, 1.0))
    assert proposal.num_drafts == [1] and proposal.tokens[0, 0] == 5
    expanded = proposal.target_probs(drafter.d2t, VOCAB)[0, 0]
    assert expanded[5] == 1.0 and expanded.sum() == 1.0


@pytest.mark.parametrize("name", list(METHODS))
def test_greedy_output_equals_autoregressive(target, name: str) -> None:
    prompts = PROMPTS + [REPEATING]
    baseline = generate(make_engine(target, None, batch=2), prompts, GREEDY, 24)
    engine = make_engine(target, enhanced(name, draft_confidence=0.3), batch=3)
    assert generate(engine, prompts, GREEDY, 24) == baseline
    assert engine.drafter.overridden > 0 and engine.stats.guard_fallbacks == 0
    assert getattr(engine.drafter.model, "recomputed", 0) == 0  # overridden steps kept the model caught up


@pytest.mark.parametrize("name", ["eagle3", "pard"])
def test_sampled_output_keeps_the_target_law(target, name: str) -> None:
    """T=1, rejection sampling on, retrieval and model drafts in the same batches (EAGLE-3: under d2t)."""
    engine = skipping_engine(target, enhanced(name), SkipRule(min_accept=0.3, probe_every=2), 64)
    law_check(target, engine, [3, 1, 4, 3, 1])
    assert engine.drafter.overridden > 0
