"""Confidence-adaptive draft length and adaptive skipping: a drafter's chain stops after its first
low-confidence draft (a prefix of the chain it would have drafted, ragged per request), the output stays the
target's (greedy: identical; T > 0: its law), and a skipped request re-probes and recovers."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from adaptive_toys import K, METHODS, law_check, skipping_engine
from specdec_cli.config import schema
from specdec_cli.drafters.base import DraftRequest, own_probability
from specdec_cli.engine.adaptive import AcceptanceTracker, SkipRule
from specdec_cli.engine.request import Request
from specdec_cli.sampling.params import BatchParams
from toy_engine import GREEDY, PROMPTS, generate, make_engine
from toys import CONTEXT, DRAFT_IDS, batch_params, build

CONTEXTS = [CONTEXT, [7, 7, 2, 9, 1, 4, 4, 0, 6], [5, 3, 5, 3, 5, 3, 8, 1, 12, 14, 2]]


def with_confidence(name: str, threshold: float, **options) -> schema.MethodConfig:
    return dataclasses.replace(METHODS[name], draft_confidence=threshold, **options)


def proposal(target, method: schema.MethodConfig, contexts: list[list[int]], temperature: float):
    drafter = build(target, method, len(contexts))
    for slot, context in enumerate(contexts):
        drafter.add_request(slot, context)
    requests = [DraftRequest(slot=slot, token_ids=list(c)) for slot, c in enumerate(contexts)]
    return drafter.propose(requests, K, batch_params(len(contexts), temperature))


@pytest.mark.parametrize("name", list(METHODS))
def test_the_stop_keeps_a_prefix_up_to_the_first_unconfident_draft(target, name: str) -> None:
    """Seeded T=1 drafts: with the stop, each row is the prefix of its unstopped chain ending at (and
    including) the first draft whose q(d) is below the threshold; the q of every kept draft is unchanged."""
    for context in CONTEXTS:  # one request at a time: some drafters' logits depend on the batch (issue 21)
        full = proposal(target, METHODS[name], [context], 1.0)
        cut = proposal(target, with_confidence(name, 0.3), [context], 1.0)
        own = full.draft_probs[0].gather(-1, _draft_ids(full.tokens[0], name))[:, 0]
        expected = next((j + 1 for j, p in enumerate(own.tolist()) if p < 0.3), full.num_drafts[0])
        num = cut.num_drafts[0]
        assert num == expected
        assert torch.equal(cut.tokens[0, :num], full.tokens[0, :num])
        assert torch.equal(cut.draft_probs[0, :num], full.draft_probs[0, :num])


def _draft_ids(tokens: torch.Tensor, name: str) -> torch.Tensor:
    """Target ids -> draft ids of the toy drafters (EAGLE-3's reduced vocabulary)."""
    if name != "eagle3":
        return tokens[:, None]
    return (DRAFT_IDS[None, :] == tokens[:, None]).int().argmax(dim=1, keepdim=True)


@pytest.mark.parametrize("name", ["draft_target", "eagle3", "pard"])
def test_num_drafts_are_ragged_inside_one_batch(target, name: str) -> None:
    counts = set()
    for threshold in (0.2, 0.4, 0.6):
        counts.add(tuple(proposal(target, with_confidence(name, threshold), CONTEXTS, 1.0).num_drafts))
    assert any(len(set(row)) > 1 for row in counts), counts


def test_greedy_confidence_is_the_drafts_softmax() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 0.0]])
    ids = torch.tensor([0, 1])
    probs = torch.tensor([[1.0, 0.0, 0.0], [0.2, 0.5, 0.3]])
    params = BatchParams.from_values([0.0, 1.0], [0, 0], [1.0, 1.0], [None, None])
    own = own_probability(logits, ids, probs, params)
    assert torch.allclose(own, torch.tensor([torch.softmax(logits[0], 0)[0].item(), 0.5]))


@pytest.mark.parametrize("policy", ["sample", "argmax"])
@pytest.mark.parametrize("name", list(METHODS))
def test_greedy_output_equals_autoregressive(target, name: str, policy: str) -> None:
    baseline = generate(make_engine(target, None, batch=2), PROMPTS, GREEDY, 20)
    engine = make_engine(target, with_confidence(name, 0.5, draft_policy=policy), batch=3)
    assert generate(engine, PROMPTS, GREEDY, 20) == baseline
    assert engine.stats.guard_fallbacks == 0
    assert engine.stats.proposed_at[K - 1] < engine.stats.proposed_at[0]  # the stop shortened some chains


@pytest.mark.parametrize("name", ["draft_target", "dflash"])
def test_sampled_output_keeps_the_target_law(target, name: str) -> None:
    """Confidence stop plus adaptive skipping, rejection sampling on, T=1."""
    engine = skipping_engine(target, with_confidence(name, 0.4), SkipRule(min_accept=0.8, probe_every=2), 64)
    law_check(target, engine, [3, 1, 4, 1, 5])
    assert engine.stats.proposed_at[K - 1] < engine.stats.proposed_at[0] / 2


def test_greedy_output_with_skipping_equals_autoregressive(target) -> None:
    baseline = generate(make_engine(target, None, batch=2), PROMPTS, GREEDY, 24)
    engine = skipping_engine(target, METHODS["eagle3"], SkipRule(min_accept=0.9, probe_every=3), 3)
    assert generate(engine, PROMPTS, GREEDY, 24) == baseline
    assert engine.tracker.skipped > 0 and engine.stats.guard_fallbacks == 0


def test_a_skipped_request_reprobes_and_recovers() -> None:
    tracker = AcceptanceTracker(SkipRule(min_accept=0.5, probe_every=3))
    request = Request(id="a", prompt_token_ids=[1], params=GREEDY, max_new_tokens=100)
    request.slot = 0

    def step(accepted: int, drafts: bool) -> None:
        assert tracker.observe(request) == drafts
        tracker.sent([request], [K if drafts else 0])
        request.emitted_tokens += 1 + (accepted if drafts else 0)

    step(0, True)  # a new request drafts (estimate START = 1)
    step(0, True)  # 0.7 >= 0.5
    step(0, False)  # 0.49 < 0.5: skipping ...
    step(0, False)
    step(0, True)  # ... except the probe on the 3rd step since it last drafted
    step(0, False)  # a failed probe (0.343): still skipping
    step(4, False)
    step(4, True)  # a successful probe: 4 accepted
    step(0, True)  # 0.7 * 0.343 + 0.3 * 4 >= 0.5: drafting again
    assert tracker.skipped == 4


def test_a_new_request_in_the_slot_starts_afresh() -> None:
    tracker = AcceptanceTracker(SkipRule(min_accept=0.5, probe_every=100))
    old = Request(id="old", prompt_token_ids=[1], params=GREEDY, max_new_tokens=100)
    old.slot = 0
    for _ in range(4):
        tracker.observe(old)
        tracker.sent([old], [K])
        old.emitted_tokens += 1
    assert not tracker.observe(old)
    new = Request(id="new", prompt_token_ids=[1], params=GREEDY, max_new_tokens=100)
    new.slot = 0
    assert tracker.observe(new)
