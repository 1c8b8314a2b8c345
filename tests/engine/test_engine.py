"""The engine end to end on toy models: losslessness, batching, placeholders, the guard, the acceptance
decision, the proposal buffer, the time breakdown and latency metrics."""
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
from specdec_cli.drafters.base import DrafterDeps, Proposal
from specdec_cli.drafters.draft_target import ModelDrafter
from specdec_cli.engine.adaptive import draft_len_for
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.metrics import distribution
from specdec_cli.engine.proposals import PLACEHOLDER_DRAFT_ID, ProposalBuffer
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.rules import AcceptanceOptions, acceptance_rule
from specdec_cli.sampling import BatchParams
from specdec_cli.engine.drive import warm_up
from specdec_cli.run.drive import run_requests
from specdec_cli.testing import exact_sequence_law, toy_model
from specdec_cli.verify.stats import fit

VOCAB = 16


@pytest.fixture(scope="module")
def target():
    return toy_model(0, vocab_size=VOCAB, num_layers=2)


def make_engine(target, method: MethodConfig, *, batch: int = 4, rejection: bool = True,
                schedule=None, draft_model=None, relaxed=None, verification: str = "token") -> SpecEngine:
    deps = DrafterDeps(target=target, num_slots=batch, max_seq_len=96, vocab_size=VOCAB,
                       device=torch.device("cpu"), dtype=torch.float32)
    if draft_model is not None:
        drafter = ModelDrafter(draft_model, num_slots=batch, max_seq_len=96, policy=method.draft_policy)
    else:
        drafter = build_drafter(method, deps)
    options = EngineOptions(max_batch_size=batch, max_seq_len=96, prefill_chunk=5,
                            max_draft_len=method.num_draft_tokens, draft_len_schedule=schedule, rejection=rejection,
                            relaxed=relaxed, verification=verification)
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


@pytest.mark.parametrize("name", ["suffix_pool", "self_spec"])
def test_warm_up_leaves_no_trace(target, name: str) -> None:
    """After the throw-away requests: no statistics, every slot free in order, no global-pool memory, and the
    same outputs (greedy and seeded T=1) as an engine that never warmed up."""
    params = [GREEDY, SamplingParams(temperature=1.0, seed=5), GREEDY, SamplingParams(temperature=1.0, seed=6)]
    cold = make_engine(target, METHODS[name], batch=3)
    warm = make_engine(target, METHODS[name], batch=3)
    warm_up(warm, [1, 2, 3, 1, 2, 3, 1, 2, 3])
    assert warm.stats.summary() == cold.stats.summary()
    assert warm.stats.target_forwards == 0 and warm.acceptance.usage == {"torch": 0, "flashinfer": 0}
    assert warm.free_slots == cold.free_slots and not warm.pending_hidden
    if name == "suffix_pool":
        assert len(warm.drafter.pool.tokens) == 0
    assert generate(warm, PROMPTS, params, 20) == generate(cold, PROMPTS, params, 20)
    for stats in (warm.stats, cold.stats):
        assert stats.target_forwards > 0
    assert (warm.stats.emitted_tokens, warm.stats.proposed_drafts) == (
        cold.stats.emitted_tokens, cold.stats.proposed_drafts)


def test_warm_up_needs_an_idle_engine(target) -> None:
    engine = make_engine(target, METHODS["self_spec"])
    engine.add_request(Request(id="0", prompt_token_ids=[1, 2], params=GREEDY, max_new_tokens=4))
    with pytest.raises(RuntimeError, match="idle"):
        warm_up(engine, [1, 2, 3])


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


def test_dynamic_draft_length_at_temperature_keeps_greedy_rows_exact(target) -> None:
    """K goes 3 -> 0 -> 3 in a mixed batch (greedy and seeded T > 0 rows): every request finishes, nothing
    falls back, and the greedy rows equal autoregressive greedy decoding token for token."""
    engine = make_engine(target, METHODS["self_spec"], batch=4, schedule={2: 3})
    sampled = SamplingParams(temperature=1.0, top_k=6, seed=11)
    params = [GREEDY, sampled, GREEDY, SamplingParams(temperature=0.7, seed=5)]
    requests = [Request(id=str(i), prompt_token_ids=p, params=par, max_new_tokens=n)
                for i, (p, par, n) in enumerate(zip(PROMPTS, params, [40, 8, 10, 12]))]
    engine.add_request(requests[0])
    engine.add_request(requests[1])
    for _ in range(5):
        engine.step()
    before = engine.stats.proposed_drafts
    for request in requests[2:]:
        engine.add_request(request)
    while engine.has_work():
        engine.step()
    assert before > 0 and engine.stats.proposed_drafts > before and engine.stats.guard_fallbacks == 0
    assert all(len(r.output_token_ids) == r.max_new_tokens for r in requests)
    for request in (requests[0], requests[2]):
        assert generate(make_engine(target, NoneMethodConfig()), [request.prompt_token_ids], GREEDY,
                        request.max_new_tokens)[0] == request.output_token_ids


def test_all_greedy_batches_never_run_rejection(target, monkeypatch) -> None:
    import specdec_cli.engine.rules as rules

    calls = []
    real = rules.rejection_sample_with
    monkeypatch.setattr(rules, "rejection_sample_with", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    engine = make_engine(target, METHODS["self_spec"], rejection=True)
    mixed = [GREEDY, SamplingParams(temperature=1.0, seed=1), GREEDY, GREEDY]
    generate(engine, PROMPTS, mixed, 12)
    assert calls  # a batch with a sampled row runs rejection

    def forbidden(*args, **kwargs):
        raise AssertionError("rejection sampling ran on an all-greedy batch")

    monkeypatch.setattr(rules, "rejection_sample_with", forbidden)
    engine = make_engine(target, METHODS["self_spec"], rejection=True)
    generate(engine, PROMPTS, GREEDY, 20)
    assert engine.stats.accepted_drafts > 0


def _params(*temperatures: float) -> BatchParams:
    return BatchParams.from_values(temperatures, [0] * len(temperatures), [1.0] * len(temperatures),
                                   [None] * len(temperatures))


@pytest.mark.parametrize("temperatures,k,options,proposal_ok,rule", [
    ((0.0, 0.0), 3, AcceptanceOptions(rejection=True), True, "argmax"),
    ((0.0, 0.0), 0, AcceptanceOptions(rejection=True), True, "argmax"),
    ((0.0, 1.0), 3, AcceptanceOptions(rejection=True), True, "rejection"),
    ((1.0,), 3, AcceptanceOptions(rejection=True), False, "strict"),  # fail closed
    ((1.0,), 0, AcceptanceOptions(rejection=True), True, "strict"),  # nothing drafted: no rejection
    ((1.0,), 3, AcceptanceOptions(rejection=False), True, "strict"),
    ((0.0,), 3, AcceptanceOptions(rejection=False, relaxed=(4, 0.5)), True, "relaxed"),
    ((1.0,), 3, AcceptanceOptions(rejection=False, relaxed=(4, 0.5)), True, "relaxed"),
    ((1.0,), 0, AcceptanceOptions(rejection=False, relaxed=(4, 0.5)), True, "strict"),
    ((0.0,), 0, AcceptanceOptions(rejection=False, relaxed=(4, 0.5)), True, "argmax"),
])
def test_acceptance_rule_decision_table(temperatures, k, options, proposal_ok, rule) -> None:
    assert acceptance_rule(_params(*temperatures), k, options, proposal_ok=proposal_ok).name == rule


def test_argmax_rule_emits_the_target_argmax_prefix() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, VOCAB, generator=gen)
    drafts = logits[:, :3].argmax(-1)
    drafts[1, 1] = (drafts[1, 1] + 1) % VOCAB
    tokens, emitted = acceptance_rule(_params(0, 0, 0), 3, AcceptanceOptions()).accept(logits, drafts, None,
                                                                                      _params(0, 0, 0))
    assert torch.equal(emitted, torch.tensor([4, 2, 4]))
    assert torch.equal(tokens[0], logits[0].argmax(-1)) and torch.equal(tokens[1, 2:], torch.tensor([-1, -1]))


def test_proposal_buffer_write_placeholder_read_and_check() -> None:
    buffer = ProposalBuffer(num_slots=2, max_draft_len=3, vocab_size=VOCAB, store_probs=True)
    q = torch.rand(3, VOCAB).softmax(-1)
    buffer.write(1, torch.tensor([5, 6, 7]), q, num=2)
    tokens, probs, ok = buffer.read([1], 2)  # runtime k below the maximum
    assert torch.equal(tokens, torch.tensor([[5, 6]])) and torch.equal(probs, q[None, :2]) and ok
    assert buffer.read([1, 0], 1)[0].shape == (2, 1) and buffer.check(1) is None
    buffer.write(0, torch.tensor([3, 4, 9]), None, num=3)  # deterministic draft: one-hot q at the tokens
    assert torch.equal(buffer.read([0], 3)[1][0], torch.eye(VOCAB)[[3, 4, 9]])
    buffer.write_placeholder(1)
    assert buffer.num_drafts[1] == 0 and buffer.check(1) is None
    assert torch.equal(buffer.draft_probs[1], torch.eye(VOCAB)[[PLACEHOLDER_DRAFT_ID] * 3])
    buffer.write_placeholder(1)  # already a placeholder: left as it is
    buffer.write(1, torch.tensor([8, 9, 10]), q, num=1)  # a real draft, then the placeholder again: rewritten
    buffer.write_placeholder(1)
    assert torch.equal(buffer.draft_probs[1], torch.eye(VOCAB)[[PLACEHOLDER_DRAFT_ID] * 3])
    assert torch.equal(buffer.draft_tokens[1], torch.full((3,), PLACEHOLDER_DRAFT_ID))
    buffer.draft_probs[0, 0, 3] = 0.0
    assert buffer.read([0], 3)[2] is False  # q(d) = 0: fail closed
    buffer.num_drafts[0] = 4
    assert "at most 3" in buffer.check(0)
    buffer.draft_tokens[0, 0], buffer.num_drafts[0] = VOCAB, 1
    assert "outside the target vocabulary" in buffer.check(0)


def test_proposal_buffer_applies_d2t_once_when_written() -> None:
    """A reduced draft vocabulary (Vd = 4): q is stored in target ids; a one-hot proposal under d2t is refused."""
    d2t = torch.tensor([2, 5, 9, 11])  # draft id i -> target id i + d2t[i]: 2, 6, 11, 14
    buffer = ProposalBuffer(num_slots=2, max_draft_len=2, vocab_size=VOCAB, store_probs=True)
    draft_q = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 1.0, 0.0]]])
    buffer.write_proposal([1], Proposal(tokens=torch.tensor([[14, 11]]), draft_probs=draft_q, num_drafts=[2]), d2t)
    tokens, probs, ok = buffer.read([1], 2)
    assert ok and torch.equal(tokens, torch.tensor([[14, 11]]))
    assert torch.equal(probs[0, 0, [2, 6, 11, 14]], draft_q[0, 0]) and float(probs[0, 0].sum()) == pytest.approx(1)
    assert float(probs[0, 1, 11]) == 1.0
    with pytest.raises(ValueError, match="reduced vocabulary"):
        buffer.write_proposal([0], Proposal(tokens=torch.tensor([[14, 11]]), draft_probs=None, num_drafts=[2]), d2t)


def test_time_breakdown_sums_to_the_wall_time(target) -> None:
    engine = make_engine(target, METHODS["self_spec"])
    generate(engine, PROMPTS, SamplingParams(temperature=1.0, seed=3), 16)
    breakdown = engine.stats.summary()["time_breakdown_s"]
    assert set(breakdown) == {"target_forward", "draft", "accept", "other"}
    assert all(value >= 0 for value in breakdown.values()) and breakdown["target_forward"] > 0
    total = sum(breakdown.values())
    assert total == pytest.approx(engine.stats.step_s)
    assert 0.9 * engine.stats.wall_s <= total <= engine.stats.wall_s


def test_latency_metrics_and_per_request_acceptance(target) -> None:
    engine = make_engine(target, METHODS["self_spec"], batch=2)
    requests = [Request(id=str(i), prompt_token_ids=p, params=GREEDY, max_new_tokens=10) for i, p in enumerate(PROMPTS)]
    run_requests(engine, requests)
    summary = engine.stats.summary()
    for key in ("ttft_s", "tpot_s", "itl_s"):
        assert set(summary[key]) == {"mean", "p50", "p95", "p99"}
        assert 0 < summary[key]["p50"] <= summary[key]["p95"] <= summary[key]["p99"]
    assert len(engine.stats.latency.ttft_s) == len(engine.stats.latency.tpot_s) == len(requests)
    assert len(engine.stats.latency.itl_s) == sum(len(r.output_token_ids) - 1 for r in requests)
    # requests 2 and 3 waited for a free slot: their first token came later
    assert min(r.ttft_s for r in requests[2:]) > max(r.ttft_s for r in requests[:2])
    assert sum(r.emitted_tokens for r in requests) == engine.stats.emitted_tokens
    for request in requests:
        assert request.acceptance_length == request.emitted_tokens / request.steps >= 1.0


def test_latency_definitions_on_a_hand_made_request() -> None:
    request = Request(id="0", prompt_token_ids=[1], params=GREEDY, max_new_tokens=4, arrival_s=0.5, finish_s=2.0)
    request.chunks = [(1.0, 1), (1.4, 3), (2.0, 6)]  # the last chunk was cut to 1 token by a stop
    request.output_token_ids = [7, 7, 7, 7]
    assert request.ttft_s == 0.5 and request.tpot_s == pytest.approx(1.0 / 3)
    assert request.itl_s == pytest.approx([0.2, 0.2, 0.6])
    assert distribution([]) == {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0}
    assert distribution([4.0, 1.0, 3.0, 2.0]) == pytest.approx({"mean": 2.5, "p50": 2.5, "p95": 3.85, "p99": 3.97})


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


@pytest.mark.parametrize("sampler", ["temperature", "topk"])
def test_block_verified_output_follows_target_law(target, sampler: str) -> None:
    """``rejection.verification=block`` in the engine, batched: the exact law of 4 tokens (the prefill's, then a
    chain of 2 drafts and its bonus). Setting h_i = w_i in ``block_verify`` fails this (p ~ 1e-6)."""
    prompt = [3, 1, 4, 1, 5]
    law = exact_sequence_law(target, prompt, 4, **SAMPLERS[sampler])
    engine = make_engine(target, DraftTargetMethodConfig(self_speculative_layers=1, num_draft_tokens=3), batch=64,
                         verification="block")
    samples = sample_sequences(engine, prompt, SAMPLERS[sampler], 6000, 4)
    assert 0 < engine.stats.accepted_drafts < engine.stats.proposed_drafts
    assert engine.acceptance.usage["torch"] > 0
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
