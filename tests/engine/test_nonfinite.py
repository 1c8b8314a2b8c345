"""A request whose target logits stop being finite fails alone: finish_reason "error" with the reason, its
tokens before the fault kept, its slot released; the other requests match the fault-free run bitwise."""
from __future__ import annotations

import pytest
import torch

from specdec_cli.config.schema import DraftTargetMethodConfig, NgramMethodConfig
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.engine.engine import EngineOptions, Feed, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.run.drive import run_requests
from specdec_cli.run.result import output_row
from specdec_cli.testing import toy_model

VOCAB = 16
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7], [9, 9, 9, 3], [4, 3, 2, 1, 4, 3], [2, 2, 5], [7, 1, 7, 1]]


@pytest.fixture(scope="module")
def target():
    return toy_model(0, vocab_size=VOCAB, num_layers=2)


class FaultyTarget:
    """The target, but the logits of request ``victim`` become ``value`` at its ``at``-th logits-bearing forward."""

    def __init__(self, target, engine_ref: list, victim: str, at: int, value: float) -> None:
        self.inner, self.engine_ref, self.victim, self.at, self.value, self.seen = target, engine_ref, victim, at, value, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, cache, slots, tokens, *, logits_for, **kwargs):
        output = self.inner(cache, slots, tokens, logits_for=logits_for, **kwargs)
        row = next((i for i, r in enumerate(self.engine_ref[0].active) if r.id == self.victim), None)
        if row is not None and logits_for[row] > 0:
            self.seen += 1
            if self.seen == self.at:
                start = sum(logits_for[:row])
                output.logits[start + logits_for[row] - 1, 3] = self.value  # one position, one entry
        return output


def run(target, method, params, *, fault=None) -> list[Request]:
    deps = DrafterDeps(target=target, num_slots=3, max_seq_len=64, vocab_size=VOCAB, device=torch.device("cpu"),
                       dtype=torch.float32)
    options = EngineOptions(max_batch_size=3, max_seq_len=64, prefill_chunk=4, max_draft_len=method.num_draft_tokens)
    engine_ref: list = []
    model = target if fault is None else FaultyTarget(target, engine_ref, *fault)
    engine = SpecEngine(model, build_drafter(method, deps), options)
    engine_ref.append(engine)
    requests = [Request(id=str(i), prompt_token_ids=list(p), params=params(i), max_new_tokens=20)
                for i, p in enumerate(PROMPTS)]
    run_requests(engine, requests)
    assert not engine.active and sorted(engine.free_slots) == [0, 1, 2]
    return requests


CASES = {
    "greedy-ngram": (NgramMethodConfig(min_n=1, max_n=3, num_draft_tokens=3), lambda i: SamplingParams()),
    "seeded-self-spec": (DraftTargetMethodConfig(self_speculative_layers=1, num_draft_tokens=3),
                         lambda i: SamplingParams(temperature=1.0, seed=100 + i)),
}


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("at", [1, 3])  # 1: the first token after prefill; 3: a verify step
@pytest.mark.parametrize("case", list(CASES))
def test_nonfinite_logits_fail_one_request_only(target, case: str, at: int, value: float) -> None:
    method, params = CASES[case]
    clean = run(target, method, params)
    faulty = run(target, method, params, fault=("1", at, value))
    for good, got in zip(clean, faulty):
        if got.id != "1":
            assert (got.output_token_ids, got.finish_reason, got.error) == (good.output_token_ids, "length", None)
    victim = faulty[1]
    assert victim.finish_reason == "error"
    where = "after the prompt" if at == 1 else f"at step {victim.steps + 1}"
    assert victim.error == f"non-finite target logits {where}"
    assert victim.steps == max(0, at - 2) and (len(victim.output_token_ids) > 0) == (at > 1)
    assert clean[1].output_token_ids[: len(victim.output_token_ids)] == victim.output_token_ids
    row = output_row(victim)
    assert row["finish_reason"] == "error" and row["error"] == victim.error
    assert "error" not in output_row(faulty[0])


def test_the_cheap_row_sum_screen_never_fails_finite_logits(target) -> None:
    """Row sums screen the logits (a finite sum: every entry finite); finite logits whose sum overflows take the
    exact check and fail no request, a NaN among them still fails its request."""
    engine = SpecEngine(target, None, EngineOptions(max_batch_size=1, max_seq_len=64))
    request = Request(id="0", prompt_token_ids=[1, 2], params=SamplingParams(), max_new_tokens=4)
    feeds = [Feed([1, 2], 2, prefill=False)]
    logits = torch.zeros(2, VOCAB)
    logits[:, :2] = 3e38  # finite entries; each row's sum is +inf
    assert not torch.isfinite(logits.sum(dim=-1)).any() and torch.isfinite(logits).all()
    assert engine._contain_nonfinite([request], feeds, logits) == set() and request.finish_reason is None
    logits[1, 5] = float("nan")
    assert engine._contain_nonfinite([request], feeds, logits) == {0} and request.finish_reason == "error"
