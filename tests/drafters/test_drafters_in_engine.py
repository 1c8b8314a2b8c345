"""Every learned drafter through the engine on the toy target: greedy speculative output equals greedy
autoregressive output, sampled output follows the target's law, and staggered arrivals (K dropping to 0
and coming back) keep each drafter in sync."""
from __future__ import annotations

from typing import Callable

import pytest

from specdec_cli.config import schema
from specdec_cli.engine.request import SamplingParams
from toy_engine import (GREEDY, PROMPTS, SAMPLERS, check_law, check_staggered, generate, make_engine,
                        trained_toy_checkpoint)
from toys import toy_dflash_checkpoint, toy_pard_checkpoint

CONFIGS = {"eagle3": schema.Eagle3MethodConfig, "mtp": schema.MtpMethodConfig, "pard": schema.PardMethodConfig,
           "dflash": schema.DflashMethodConfig}


@pytest.fixture(scope="module")
def checkpoint(target, tmp_path_factory) -> Callable[[str], str]:
    """method -> its toy checkpoint: EAGLE-3 and MTP heads trained for a few seconds (random heads are never
    accepted), the random PARD and DFlash toys (built once per module)."""
    built: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in built:
            if name in ("eagle3", "mtp"):
                built[name] = trained_toy_checkpoint(name, target, tmp_path_factory.mktemp(name))
            else:
                built[name] = toy_pard_checkpoint() if name == "pard" else toy_dflash_checkpoint()
        return built[name]

    return get


def method(name: str, checkpoint: Callable[[str], str], **options) -> schema.MethodConfig:
    return CONFIGS[name](checkpoint=checkpoint(name), **{"num_draft_tokens": 3, **options})


@pytest.mark.parametrize("policy", ["sample", "argmax"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_speculative_equals_autoregressive(target, checkpoint, name: str, policy: str) -> None:
    baseline = generate(make_engine(target, None, batch=2), PROMPTS, GREEDY, 24)
    engine = make_engine(target, method(name, checkpoint, draft_policy=policy), batch=3)
    assert generate(engine, PROMPTS, GREEDY, 24) == baseline
    assert engine.stats.accepted_drafts > 0 and engine.stats.guard_fallbacks == 0
    assert getattr(engine.drafter, "recomputed", 0) == 0  # feature drafters: the engine brought every feature


def test_dflash_k_beyond_its_block_gives_ragged_drafts(target, checkpoint) -> None:
    """K = 5 > block_size - 1 = 3: three drafts per step, still lossless."""
    baseline = generate(make_engine(target, None, batch=2), PROMPTS, GREEDY, 24)
    engine = make_engine(target, method("dflash", checkpoint, num_draft_tokens=5), batch=3)
    assert generate(engine, PROMPTS, GREEDY, 24) == baseline
    assert engine.stats.accepted_drafts > 0 and engine.stats.guard_fallbacks == 0


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_sampled_output_follows_the_target_law(target, checkpoint, name: str, sampler: str) -> None:
    policy = "argmax" if sampler == "argmax" else "sample"
    check_law(target, method(name, checkpoint, num_draft_tokens=2, draft_policy=policy), sampler)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_staggered_arrivals_and_context_only_steps(target, checkpoint, name: str) -> None:
    check_staggered(target, method(name, checkpoint))


@pytest.mark.parametrize("name", [None, *CONFIGS])
def test_the_graphed_verify_path_gives_the_same_tokens(target, checkpoint, name) -> None:
    """engine.cuda_graphs: decode-phase verifies go through ``GraphedVerify`` (on CPU its dense forward runs
    eagerly, the function a CUDA graph would capture): the same tokens as the ragged forward, greedy and seeded."""
    spec = None if name is None else method(name, checkpoint)
    seeded = [SamplingParams(seed=i, **SAMPLERS["temperature"]) for i in range(len(PROMPTS))]
    for params in (GREEDY, seeded):
        expected = generate(make_engine(target, spec, batch=3), PROMPTS, params, 20)
        engine = make_engine(target, spec, batch=3, cuda_graphs=True)
        assert generate(engine, PROMPTS, params, 20) == expected
        runner = engine.graphed.runner
        assert runner.eager_runs > 0 and runner.replays == 0 and not runner.enabled  # CPU: no capture
