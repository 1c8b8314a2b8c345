"""Shared fixtures of the adaptive-drafting tests: a toy config for every model drafter, an engine with
adaptive skipping, and the T=1 target-law check."""
from __future__ import annotations

import torch

from specdec_cli.config import schema
from specdec_cli.engine.adaptive import SkipRule
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import SamplingParams
from specdec_cli.testing import exact_sequence_law
from specdec_cli.verify.stats import fit
from toy_engine import generate
from toys import VOCAB, build, toy_checkpoint, toy_dflash_checkpoint, toy_pard_checkpoint

K = 4
METHODS = {
    "draft_target": schema.DraftTargetMethodConfig(self_speculative_layers=1, num_draft_tokens=K),
    "eagle3": schema.Eagle3MethodConfig(checkpoint=toy_checkpoint("eagle3"), num_draft_tokens=K),  # Vd 12 of 16
    "mtp": schema.MtpMethodConfig(checkpoint=toy_checkpoint("mtp", reduced=False), num_draft_tokens=K),
    "pard": schema.PardMethodConfig(checkpoint=toy_pard_checkpoint(), num_draft_tokens=K),
    "dflash": schema.DflashMethodConfig(checkpoint=toy_dflash_checkpoint(block_size=5), num_draft_tokens=K),
}


def skipping_engine(target, method: schema.MethodConfig, rule: SkipRule, batch: int) -> SpecEngine:
    """``method`` on the toy target with adaptive skipping under ``rule``, ``batch`` slots."""
    options = EngineOptions(max_batch_size=batch, max_seq_len=96, prefill_chunk=5, max_draft_len=K, skip=rule)
    return SpecEngine(target, build(target, method, batch, 96), options)


def law_check(target, engine: SpecEngine, prompt: list[int], num: int = 3000) -> None:
    """The first 3 tokens follow the target's T=1 law (joint chi-square, each marginal chi-square + TV); requests
    generate 3 + K tokens (no EOS), so that chains of every length end inside the tested tokens."""
    law = exact_sequence_law(target, prompt, 3, temperature=1.0)
    outputs = generate(engine, [prompt] * num, [SamplingParams(temperature=1.0, seed=i) for i in range(num)], 3 + K)
    samples = torch.tensor([output[:3] for output in outputs])  # K more tokens: whole chains inside the 3
    assert 0 < engine.stats.accepted_drafts < engine.stats.proposed_drafts
    assert engine.stats.guard_fallbacks == 0
    index = (samples[:, 0] * VOCAB + samples[:, 1]) * VOCAB + samples[:, 2]
    assert fit(torch.bincount(index, minlength=law.numel()), law.flatten()).p_value > 1e-4
    for position in range(3):
        marginal = law.sum(dim=[d for d in range(3) if d != position])
        result = fit(torch.bincount(samples[:, position], minlength=VOCAB), marginal)
        assert result.passed, (position, result)
