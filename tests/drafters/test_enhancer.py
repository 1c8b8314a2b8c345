"""The suffix enhancer over every model drafter: where the request's own text repeats, its drafts are the
retrieval continuation with a one-hot q at its target ids (also under d2t, also outside the draft vocabulary);
the output stays the target's (greedy: identical; T > 0: its law, rejection sampling on)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from adaptive_toys import K, METHODS, law_check, skipping_engine
from specdec_cli.drafters.base import DraftRequest
from specdec_cli.drafters.enhancer import SuffixEnhancer
from specdec_cli.engine.adaptive import SkipRule
from specdec_cli.sampling import one_hot
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
    continuation = [4, 5, 6, 1]
    assert proposal.num_drafts[0] == len(continuation) and drafter.overridden == 1
    assert proposal.tokens[0, : len(continuation)].tolist() == continuation
    assert proposal.one_hot_rows == (0,)
    q = proposal.target_probs(drafter.d2t, VOCAB)[0, : len(continuation)]
    assert torch.equal(q, one_hot(torch.tensor(continuation), VOCAB))
    fresh_q = proposal.draft_probs[1, : proposal.num_drafts[1]]
    assert proposal.num_drafts[1] >= 1 and torch.allclose(fresh_q.sum(-1), torch.ones(len(fresh_q)))


def test_the_override_drafts_tokens_outside_the_draft_vocabulary(target) -> None:
    """Retrieval copies rare tokens best, which a reduced draft vocabulary lacks: they are drafted with q one-hot
    at their target ids, and the model rows of the same batch keep their own q."""
    drafter = build(target, enhanced("eagle3", min_match=2), 2)
    context = [0, 1, 2, 5, 4, 0, 1, 2]  # continuation [5, 4, 0, 1]: 4 is not in the draft vocabulary
    assert 4 not in DRAFT_IDS.tolist() and 5 in DRAFT_IDS.tolist()
    for slot, tokens in enumerate([context, FRESH]):
        drafter.add_request(slot, tokens)
    requests = [DraftRequest(slot=s, token_ids=t) for s, t in enumerate([context, FRESH])]
    proposal = drafter.propose(requests, K, batch_params(2, 1.0))
    assert proposal.num_drafts[0] == 4 and proposal.tokens[0].tolist() == [5, 4, 0, 1]
    expanded = proposal.target_probs(drafter.d2t, VOCAB)
    assert torch.equal(expanded[0], one_hot(torch.tensor([5, 4, 0, 1]), VOCAB))
    model_rows = expanded[1, : proposal.num_drafts[1]]
    assert torch.allclose(model_rows.sum(-1), torch.ones(len(model_rows)))
    assert bool((model_rows[:, ~torch.isin(torch.arange(VOCAB), DRAFT_IDS)] == 0).all())  # q under d2t: in vocab


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
