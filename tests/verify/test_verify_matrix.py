"""``specdec verify --toy`` over every implemented method variant × sampler (slow tier).

The fast tier runs a few of these through the CLI (tests/cli/test_verify_cli.py).
"""
from __future__ import annotations

import pytest

from specdec_cli.verify.check import verify
from specdec_cli.verify.setup import VerifyOptions

METHODS = {
    "self_spec": ("method=draft_target",),
    "self_spec_argmax": ("method=draft_target", "method.draft_policy=argmax"),
    "self_spec_strict": ("method=draft_target", "rejection=off"),
    "self_spec_block": ("method=draft_target", "rejection.verification=block"),
    "ngram": ("method=ngram", "method.min_n=1"),
    "suffix": ("method=suffix", "method.min_match_len=1"),
    "suffix_pool": ("method=suffix", "method.min_match_len=1", "method.use_global_pool=true"),
}
SAMPLERS = ("greedy", "temperature", "topk", "topp", "topk_topp")


@pytest.mark.slow
@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("method", list(METHODS))
def test_toy_verify_passes(method: str, sampler: str) -> None:
    outcome = verify([*METHODS[method], f"sampler={sampler}"], VerifyOptions(toy=True, num_prompts=2))
    failed = [test for test in outcome.verdict.tests if outcome.verdict.failed(test)]
    assert outcome.verdict.match, failed
    assert outcome.proposed_drafts > 0
