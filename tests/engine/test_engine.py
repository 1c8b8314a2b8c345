"""The engine end to end on toy models: losslessness, batching, placeholders, the guard."""
from __future__ import annotations

import pytest
import torch

from specdec_cli.config.schema import (
    DraftTargetMethodConfig,
    MethodConfig,
    NgramMethodConfig,
    NoneMethodConfig,
    SuffixMethodConfig,
)
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.drafters.draft_target import ModelDrafter
from specdec_cli.engine.engine import EngineOptions, SpecEngine, draft_len_for
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.run.drive import run_requests
from specdec_cli.testing import exact_sequence_law, toy_model
from specdec_cli.verify.stats import fit

VOCAB = 16


@pytest.fixture(scope="module")
def target():
    return toy_model(0, vocab_size=VOCAB, num_layers=2)


def make_engine(target, method: MethodConfig, *, batch: int = 4, rejection: bool = True,
                schedule=None, draft_model=None, relaxed=None) -> SpecEngine:
    deps = DrafterDeps(target=target, num_slots=batch, max_seq_len=96, vocab_size=VOCAB,
                       device=torch.device("cpu"), dtype=torch.float32)
    if draft_model is not None:
        drafter = ModelDrafter(draft_model, num_slots=batch, max_seq_len=96, policy=method.draft_policy)
    else:
        drafter = build_drafter(method, deps)
    options = EngineOptions(max_batch_size=batch, max_seq_len=96, prefill_chunk=5,
                            max_draft_len=method.num_draft_tokens, draft_len_schedule=schedule, rejection=rejection,
                            relaxed=relaxed)
    return SpecEngine(target, drafter, options)


def generate(engine: SpecEngine, prompts, params: SamplingParams | list[SamplingParams], max_new: int):
    params_list = params if isinstance(params, list) else [params] * len(prompts)
    requests = [Request(id=str(i), prompt_token_ids=list(p), params=par, max_new_tokens=max_new)
                for i, (p, par) in enumerate(zip(prompts, params_list))]
    run_requests(engine, requests)
    return [r.output_token_ids for r in requests]


PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 6, 7], [9, 9, 9, 9, 9, 9, 3], [4, 3, 2, 1, 0, 4, 3, 2, 1, 0, 4, 3, 2]]
GREEDY = SamplingParams(temperature=0.0)

METHODS = {
    "ngram": NgramMethodConfig(min_n=1, max_n=3, num_draft_tokens=3),
    "suffix": SuffixMethodConfig(num_draft_tokens=3, min_match_len=1),
    "suffix_pool": SuffixMethodConfig(num_draft_tokens=3, min_match_len=1, use_global_pool=True),
    "self_spec": DraftTargetMethodConfig(self_speculative_layers=1, num_draft_tokens=3),
    "self_spec_argmax": DraftTargetMethodConfig(self_speculative_layers=1, num_draft_tokens=2, draft_policy="argmax"),
}


@pytest.mark.parametrize("name", list(METHODS))
def test_greedy_speculative_equals_autoregressive(target, name: str) -> None:
    baseline = generate(make_engine(target, NoneMethodConfig(), batch=2), PROMPTS, GREEDY, 30)
    engine = make_engine(target, METHODS[name], batch=3)
    assert generate(engine, PROMPTS, GREEDY, 30) == baseline
    assert engine.stats.proposed_drafts > 0
    assert engine.stats.guard_fallbacks == 0


def test_independent_draft_model_greedy_equality(target) -> None:
    draft = toy_model(7, vocab_size=VOCAB, num_layers=1)
    baseline = generate(make_engine(target, NoneMethodConfig()), PROMPTS, GREEDY, 20)
    engine = make_engine(target, DraftTargetMethodConfig(num_draft_tokens=4), draft_model=draft)
    assert generate(engine, PROMPTS, GREEDY, 20) == baseline


def test_continuous_batching_100_requests_each_equal_to_alone(target) -> None:
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (int(torch.randint(2, 12, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(100)]
    lengths = [int(x) for x in torch.randint(1, 20, (100,), generator=gen)]
    engine = make_engine(target, METHODS["self_spec"], batch=8)
    requests = [Request(id=str(i), prompt_token_ids=p, params=GREEDY, max_new_tokens=n)
                for i, (p, n) in enumerate(zip(prompts, lengths))]
    run_requests(engine, requests)
    assert all(r.finish_reason == "length" and len(r.output_token_ids) == r.max_new_tokens for r in requests)
    alone = make_engine(target, NoneMethodConfig(), batch=1)
    for request in requests[::7]:
        assert generate(alone, [request.prompt_token_ids], GREEDY, request.max_new_tokens)[0] == request.output_token_ids


def test_seeded_request_is_batch_invariant(target) -> None:
    params = SamplingParams(temperature=1.0, seed=42)
    alone = generate(make_engine(target, METHODS["self_spec"], batch=1), [PROMPTS[1]], params, 16)[0]
    others = [SamplingParams(temperature=1.0, seed=s) for s in (1, 2, 3)]
    batched = generate(make_engine(target, METHODS["self_spec"], batch=4), PROMPTS, [others[0], params, *others[1:]], 16)
    assert batched[1] == alone


def test_draft_len_schedule_lookup() -> None:
    schedule = {4: 4, 8: 2, 32: 1}
    assert [draft_len_for(bs, 4, schedule) for bs in (1, 4, 5, 8, 9, 32, 33)] == [4, 4, 2, 2, 1, 1, 0]
    assert draft_len_for(9, 4, None) == 4


def test_dynamic_draft_length_toggles_and_stays_lossless(target) -> None:
    """K goes 3 -> 0 -> 3 as requests join and leave (batch >= 3 drafts nothing)."""
    engine = make_engine(target, METHODS["self_spec"], batch=4, schedule={2: 3})
    lengths = [40, 8, 10, 12]
    requests = [Request(id=str(i), prompt_token_ids=p, params=GREEDY, max_new_tokens=n)
                for i, (p, n) in enumerate(zip(PROMPTS, lengths))]
    engine.add_request(requests[0])
    for _ in range(4):
        engine.step()
    drafted_alone = engine.stats.proposed_drafts
    for request in requests[1:]:
        engine.add_request(request)
    engine.step()  # the newcomers prefill; K is 0 from now on while the batch holds >= 3
    while len(engine.active) >= 3:
        engine.step()
    drafted_crowded = engine.stats.proposed_drafts - drafted_alone
    while engine.has_work():
        engine.step()
    assert drafted_alone > 0 and engine.stats.proposed_drafts > drafted_alone + drafted_crowded
    for request in requests:
        assert generate(make_engine(target, NoneMethodConfig()), [request.prompt_token_ids], GREEDY,
                        request.max_new_tokens)[0] == request.output_token_ids


def test_corrupted_buffer_falls_back_to_strict_and_is_counted(target) -> None:
    engine = make_engine(target, METHODS["self_spec"], batch=2)
    params = SamplingParams(temperature=1.0, seed=0)
    request = Request(id="0", prompt_token_ids=PROMPTS[0], params=params, max_new_tokens=12)
    engine.add_request(request)
    while engine.buffer.num_drafts[request.slot] == 0:
        engine.step()  # prefill (two chunks), then the first drafts
    slot = request.slot
    engine.buffer.draft_probs[slot, 0, engine.buffer.draft_tokens[slot, 0]] = 0.0  # q(d) = 0: impossible
    while engine.has_work():
        engine.step()
    assert engine.stats.guard_fallbacks == 1
    assert len(request.output_token_ids) == 12


def test_relaxed_acceptance_accepts_near_top_drafts(target) -> None:
    """Relaxed acceptance (lossy, MTP thinking phase): a draft anywhere in the target's top
    accepts; with top-k = V and delta = 1 every draft is accepted."""
    method = DraftTargetMethodConfig(self_speculative_layers=1, num_draft_tokens=3, draft_policy="argmax")
    strict = make_engine(target, method, rejection=False)
    generate(strict, PROMPTS, GREEDY, 20)
    relaxed = make_engine(target, method, rejection=False, relaxed=(VOCAB, 1.0))
    generate(relaxed, PROMPTS, GREEDY, 20)
    assert relaxed.stats.accepted_drafts == relaxed.stats.proposed_drafts
    assert strict.stats.accepted_drafts < strict.stats.proposed_drafts


# ---------------------------------------------------------------- distribution tests
SAMPLERS = {
    "temperature": dict(temperature=1.0),
    "topk": dict(temperature=1.0, top_k=4),
    "topp": dict(temperature=0.8, top_p=0.7),
}


def sample_sequences(engine: SpecEngine, prompt, sampler: dict, num: int, num_tokens: int) -> torch.Tensor:
    params = [SamplingParams(seed=i, **sampler) for i in range(num)]
    outputs = generate(engine, [prompt] * num, params, num_tokens)
    return torch.tensor(outputs)


def assert_matches_law(samples: torch.Tensor, law: torch.Tensor) -> None:
    num_tokens = samples.shape[1]
    flat = torch.zeros(law.numel(), dtype=torch.float64)
    index = torch.zeros(samples.shape[0], dtype=torch.int64)
    for position in range(num_tokens):
        index = index * VOCAB + samples[:, position]
    flat.index_add_(0, index, torch.ones(samples.shape[0], dtype=torch.float64))
    joint = fit(flat, law.flatten())
    assert joint.p_value > 1e-4, joint
    for position in range(num_tokens):
        marginal = law.sum(dim=[d for d in range(num_tokens) if d != position])
        counts = torch.bincount(samples[:, position], minlength=VOCAB)
        result = fit(counts, marginal)
        assert result.passed, (position, result)


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_sampled_output_follows_target_law_with_rejection(target, sampler: str) -> None:
    prompt = [3, 1, 4, 1, 5]
    law = exact_sequence_law(target, prompt, 3, **SAMPLERS[sampler])
    engine = make_engine(target, DraftTargetMethodConfig(self_speculative_layers=1, num_draft_tokens=2), batch=64)
    samples = sample_sequences(engine, prompt, SAMPLERS[sampler], 3000, 3)
    assert engine.stats.accepted_drafts > 0 and engine.stats.accepted_drafts < engine.stats.proposed_drafts
    assert_matches_law(samples, law)


@pytest.mark.parametrize("name,rejection", [("ngram", False), ("suffix", False), ("self_spec_argmax", True),
                                            ("self_spec", False)])
def test_sampled_output_follows_target_law_other_rules(target, name: str, rejection: bool) -> None:
    prompt = list(range(VOCAB))  # every token occurs: retrieval drafters always find a match
    law = exact_sequence_law(target, prompt, 3, temperature=1.0)
    engine = make_engine(target, METHODS[name], batch=64, rejection=rejection)
    samples = sample_sequences(engine, prompt, {"temperature": 1.0}, 3000, 3)
    assert engine.stats.proposed_drafts > 0
    assert_matches_law(samples, law)


def test_distribution_test_detects_a_broken_residual(target, monkeypatch) -> None:
    """Power check: recovering from the target instead of the residual must be caught."""
    import specdec_cli.sampling.acceptance as acceptance

    original = acceptance.sample_target_or_residual

    def broken(target_probs, target_row, uniforms, **kwargs):
        return original(target_probs, target_row, uniforms)

    monkeypatch.setattr(acceptance, "sample_target_or_residual", broken)
    prompt = [3, 1, 4, 1, 5]
    law = exact_sequence_law(target, prompt, 3, temperature=1.0)
    engine = make_engine(target, DraftTargetMethodConfig(self_speculative_layers=1, num_draft_tokens=2), batch=64)
    samples = sample_sequences(engine, prompt, {"temperature": 1.0}, 3000, 3)
    with pytest.raises(AssertionError):
        assert_matches_law(samples, law)
