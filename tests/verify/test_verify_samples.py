"""``specdec verify``'s sampling: the shared-prompt engine behaves like the plain engine."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from specdec_cli.config.schema import DraftTargetMethodConfig, NoneMethodConfig
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.run.drive import run_requests
from specdec_cli.testing import exact_sequence_law, toy_model
from specdec_cli.verify.lossless import END
from specdec_cli.verify.samples import (
    EngineSetup,
    PromptCase,
    SharedPromptEngine,
    build_engine,
    conditional_expectation,
    sample_continuations,
)

PROMPT = (3, 1, 4, 1, 5, 9, 2, 6)


@pytest.fixture(scope="module")
def setup() -> EngineSetup:
    target = toy_model(0, vocab_size=32, num_layers=2)
    return EngineSetup(target=target, device=torch.device("cpu"), dtype=torch.float32, batch_size=4,
                       rejection=True, backend="torch", draft_len_schedule=None)


def test_shared_prompt_greedy_output_equals_the_plain_engine(setup: EngineSetup) -> None:
    plain = SpecEngine(setup.target, None, EngineOptions(max_batch_size=2, max_seq_len=64))
    request = Request(id="plain", prompt_token_ids=list(PROMPT), params=SamplingParams(), max_new_tokens=12)
    run_requests(plain, [request])
    case = PromptCase("p", PROMPT, SamplingParams())
    for method in (NoneMethodConfig(), DraftTargetMethodConfig(self_speculative_layers=1, num_draft_tokens=3)):
        engine = build_engine(setup, method, case, 12)
        assert isinstance(engine, SharedPromptEngine) and engine.shared_len == len(PROMPT) - 1
        samples = sample_continuations(engine, case, 6, 12, first_seed=0)
        assert (samples.tokens == np.array(request.output_token_ids)).all()


def test_continuations_are_seeded_and_padded_after_eos(setup: EngineSetup) -> None:
    params = SamplingParams(temperature=1.0)
    first = sample_continuations(build_engine(setup, NoneMethodConfig(), PromptCase("p", PROMPT, params), 4),
                                 PromptCase("p", PROMPT, params), 40, 4, first_seed=7)
    again = sample_continuations(build_engine(setup, NoneMethodConfig(), PromptCase("p", PROMPT, params), 4),
                                 PromptCase("p", PROMPT, params), 40, 4, first_seed=7)
    assert (first.tokens == again.tokens).all() and len({tuple(row) for row in first.tokens}) > 10
    eos = int(first.tokens[0, 1])
    case = PromptCase("p", PROMPT, params, eos_token_ids=(eos,))
    stopped = sample_continuations(build_engine(setup, NoneMethodConfig(), case, 4), case, 40, 4, first_seed=7)
    for row in stopped.tokens:
        hits = np.flatnonzero(row == eos)
        if hits.size:
            assert (row[hits[0] + 1:] == END).all()
    assert (stopped.tokens[0, 2:] == END).all()


def test_conditional_expectation_sums_the_target_law_given_each_prefix(setup: EngineSetup) -> None:
    params = SamplingParams(temperature=0.8, top_k=10)
    law = exact_sequence_law(setup.target, list(PROMPT), 3, temperature=0.8, top_k=10).numpy()
    first = law.sum((1, 2))
    a, b = np.argsort(-first)[:2]
    second = {x: law[x].sum(1) / first[x] for x in (a, b)}  # p(x2 | x1)
    c, c2 = np.argsort(-second[a])[:2]
    d = int(np.argmax(second[b]))
    tokens = np.array([[a, c, 0], [a, c2, END], [b, d, 0]])
    expected = conditional_expectation(dataclasses.replace(setup, batch_size=2), PromptCase("p", PROMPT, params),
                                       tokens)
    assert np.allclose(expected[0], 3 * first, atol=1e-5)
    assert np.allclose(expected[1], 2 * second[a] + second[b], atol=1e-5)
    third = law[a, c] / law[a, c].sum() + law[b, d] / law[b, d].sum()  # p(x3 | x1, x2); row 1 stopped
    assert np.allclose(expected[2], third, atol=1e-5)
