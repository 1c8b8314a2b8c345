"""``specdec verify``: a statistical losslessness check of one configuration.

For each prompt, sample ``num_samples`` continuations of ``num_tokens`` tokens with the
configured speculative method and as many with target-only sampling (``method=none``, the
same sampler, other seeds; ``samples.py``). Then test, per position and for the joint of the
first two positions, the speculative samples against (``lossless.py``):
- the target-only samples (two-sample chi-square);
- the target's own conditional law given each sampled prefix (teacher-forced forwards);
- with ``toy=True`` (a toy target from ``specdec_cli.testing``), the exact target law.
All tests together are judged with a Bonferroni correction.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.schema import NoneMethodConfig, RunConfig
from specdec_cli.report.rows import method_label, rejection_label, sampler_label
from specdec_cli.run.pipeline import with_resolved_method
from specdec_cli.testing import exact_sequence_law
from specdec_cli.verify import lossless
from specdec_cli.verify.lossless import Comparison, Verdict
from specdec_cli.verify.samples import (
    EngineSetup,
    PromptCase,
    SideSamples,
    build_engine,
    conditional_expectation,
    sample_continuations,
)
from specdec_cli.verify.setup import VerifyOptions, load_target, verify_config, with_defaults

TARGET_ONLY = "samples"  # target-only samples (two-sample chi-square)
CONDITIONAL = "target p"  # the target's conditional law given each sampled prefix
EXACT = "exact"  # the exact target law, enumerated (toy)


@dataclass(frozen=True)
class VerifyOutcome:
    """The verdict and what it was about (labels as in ``specdec report``)."""

    verdict: Verdict
    method: str
    sampler: str
    rejection: str
    target: str
    num_samples: int
    num_tokens: int
    proposed_drafts: int
    accepted_drafts: int
    notes: list[str] = field(default_factory=list)


def verify(overrides: list[str], options: VerifyOptions,
           progress: Callable[[str], None] = lambda line: None) -> VerifyOutcome:
    """Compose and validate the configuration, sample both sides, test, and judge."""
    options = with_defaults(options)
    cfg, effective = verify_config(overrides, options)
    auto_tree = cfg.method.tree_topk is None and effective.tree_topk > 1
    cfg = with_resolved_method(cfg, effective)  # what `specdec run` runs: EAGLE-3's auto tree at batch 1
    setup, cases, target_name = load_target(cfg, effective, options)
    num_tests = len(cases) * tests_per_prompt(options.num_tokens, options.toy)
    tv_factor = lossless.bonferroni_tv_factor(options.alpha, num_tests)
    tests: list[Comparison] = []
    proposed = accepted = 0
    for index, case in enumerate(cases):
        spec, base = _sample_case(setup, cfg, case, options, index, progress)
        proposed += spec.stats["proposed_drafts"]
        accepted += spec.stats["accepted_drafts"]
        expected = conditional_expectation(setup, case, spec.tokens)
        law = _exact_law(setup, case, options.num_tokens) if options.toy else None
        tests += compare(case.id, spec.tokens, base.tokens, expected, law, setup.target.arch.vocab_size, tv_factor)
    return VerifyOutcome(
        verdict=lossless.judge(tests, options.alpha),
        method=method_label(dataclasses.asdict(cfg.method)),
        sampler=sampler_label(dataclasses.asdict(cfg.sampler)),
        rejection=rejection_label(effective.to_dict()) + effective.verification_label(),
        target=target_name, num_samples=options.num_samples or 0, num_tokens=options.num_tokens,
        proposed_drafts=proposed, accepted_drafts=accepted,
        notes=_notes(cfg, effective, auto_tree, proposed),
    )


def tests_per_prompt(num_tokens: int, toy: bool) -> int:
    """Two-sample tests (positions + joint), conditional tests (positions), exact-law tests (toy)."""
    planned = len(lossless.planned_tests(num_tokens))
    return planned + num_tokens + (planned if toy else 0)


def compare(prompt: str, spec: np.ndarray, base: np.ndarray, expected: np.ndarray, law: Optional[np.ndarray],
            vocab_size: int, tv_factor: float) -> list[Comparison]:
    """Every test of one prompt: speculative samples [N, T] against the target-only samples
    ``base``, against the target's conditional law (``expected`` counts [T, V] given the
    sampled prefixes), and against the exact law when given."""
    results = []
    for name, positions in lossless.planned_tests(spec.shape[1]):
        spec_ids = lossless.category_ids(spec, positions, vocab_size)
        base_ids = lossless.category_ids(base, positions, vocab_size)
        numbers = lossless.two_sample_test(spec_ids, base_ids, tv_factor=tv_factor)
        results.append(Comparison(prompt, name, TARGET_ONLY, *numbers))
        if len(positions) == 1:
            column = spec[:, positions[0]]
            numbers = lossless.conditional_test(column[column != lossless.END], expected[positions[0]],
                                                tv_factor=tv_factor)
            results.append(Comparison(prompt, name, CONDITIONAL, *numbers))
        if law is not None:
            exact = lossless.law_over_categories(law, positions)
            results.append(Comparison(prompt, name, EXACT, *lossless.exact_test(spec_ids, exact, tv_factor=tv_factor)))
    return results


def _sample_case(setup: EngineSetup, cfg: RunConfig, case: PromptCase, options: VerifyOptions, index: int,
                 progress: Callable[[str], None]) -> tuple[SideSamples, SideSamples]:
    """Speculative and target-only samples of one prompt, with disjoint seeds."""
    num = options.num_samples or 0
    first_seed = options.seed + 2 * num * index
    sides = []
    for name, method, seed in (("speculative", cfg.method, first_seed),
                               ("target-only", NoneMethodConfig(), first_seed + num)):
        start, extra = time.perf_counter(), method.num_draft_tokens
        engine = build_engine(setup, method, case, options.num_tokens + extra)
        samples = sample_continuations(engine, case, num, options.num_tokens, seed, extra_tokens=extra)
        rate = samples.stats["acceptance_rate"]
        detail = f", acceptance rate {rate:.1%}" if samples.stats["proposed_drafts"] else ""
        progress(f"{case.id} ({len(case.token_ids)} prompt tokens): {name}, {num} samples in "
                 f"{time.perf_counter() - start:.1f} s{detail}")
        sides.append(samples)
    return sides[0], sides[1]


def _exact_law(setup: EngineSetup, case: PromptCase, num_tokens: int) -> np.ndarray:
    params = case.params
    law = exact_sequence_law(setup.target, list(case.token_ids), num_tokens, temperature=params.temperature,
                             top_k=params.top_k, top_p=params.top_p)
    return law.numpy()


def _notes(cfg: RunConfig, effective: EffectiveConfig, auto_tree: bool, proposed: int) -> list[str]:
    notes = []
    if auto_tree:
        nodes = effective.sampled_tree_nodes if cfg.sampler.temperature > 0 else effective.tree_nodes
        notes.append(f"method.tree_topk=auto -> {cfg.method.tree_topk}: checked the dynamic draft tree `specdec run` "
                     f"runs at batch 1 ({nodes} nodes per verify), one request at a time; method.tree_topk=1 checks "
                     "the chain")
    if proposed == 0:
        notes.append("the speculative runs proposed no drafts: this check says nothing about acceptance")
    if cfg.sampler.temperature == 0:
        notes.append("greedy sampler: speculative and target-only outputs must be identical")
    return notes
