"""``specdec verify``: a statistical losslessness check of one configuration.

For each prompt, sample ``num_samples`` continuations of ``num_tokens`` tokens with the
configured speculative method and as many with target-only sampling (``method=none``, the
same sampler, other seeds). Then test, per position and for the joint of the first two
positions, the speculative samples against (``lossless.py``):
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
import torch

from specdec_cli.config.compose import compose_config
from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.schema import DraftTargetMethodConfig, NoneMethodConfig, RunConfig
from specdec_cli.config.validate import resolve
from specdec_cli.drafters import DRAFTERS
from specdec_cli.engine.request import SamplingParams
from specdec_cli.errors import ConfigError
from specdec_cli.models import Transformer
from specdec_cli.report import lossless
from specdec_cli.report.lossless import Comparison, Verdict
from specdec_cli.report.rows import method_label, rejection_label, sampler_label
from specdec_cli.report.verify_sampling import (
    EngineSetup,
    PromptCase,
    SideSamples,
    build_engine,
    conditional_expectation,
    sample_continuations,
)

TOY_VOCAB = 32
TOY_LAYERS = 2
TOY_PROMPTS = ((3, 1, 4, 1, 5, 9, 2, 6), (1, 2, 3, 4, 1, 2, 3, 4, 1, 2), (7, 7, 7, 0, 7, 7, 7, 0, 7))
DEFAULT_SAMPLES = {False: 400, True: 1000}  # per prompt and side; keyed by toy
DEFAULT_PROMPTS = {False: 3, True: 2}
DEFAULT_BATCH = {False: 32, True: 128}
TARGET_ONLY = "samples"  # target-only samples (two-sample chi-square)
CONDITIONAL = "target p"  # the target's conditional law given each sampled prefix
EXACT = "exact"  # the exact target law, enumerated (toy)


@dataclass(frozen=True)
class VerifyOptions:
    """The command-line options of ``specdec verify`` (None: the real/toy default)."""

    num_tokens: int = 3
    num_samples: Optional[int] = None  # None: DEFAULT_SAMPLES
    num_prompts: Optional[int] = None  # None: DEFAULT_PROMPTS
    batch_size: Optional[int] = None  # None: DEFAULT_BATCH (replaces engine.max_batch_size)
    alpha: float = 0.01
    seed: int = 0
    toy: bool = False


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
    options = _with_defaults(options)
    cfg = compose_config(overrides)
    effective = resolve(cfg)
    _check_method(cfg)
    if options.toy:
        cfg = _toy_method(cfg)
    setup, cases, target_name = _load(cfg, effective, options)
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
        rejection=rejection_label(effective.to_dict()),
        target=target_name, num_samples=options.num_samples or 0, num_tokens=options.num_tokens,
        proposed_drafts=proposed, accepted_drafts=accepted,
        notes=_notes(cfg, proposed),
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


def _with_defaults(options: VerifyOptions) -> VerifyOptions:
    problems = []
    if not 1 <= options.num_tokens <= 8:
        problems.append(f"--tokens {options.num_tokens}: must be in 1..8")
    if options.num_samples is not None and options.num_samples < 20:
        problems.append(f"--samples {options.num_samples}: must be >= 20 per prompt")
    if options.num_prompts is not None and options.num_prompts < 1:
        problems.append(f"--prompts {options.num_prompts}: must be >= 1")
    if options.batch_size is not None and options.batch_size < 1:
        problems.append(f"--batch {options.batch_size}: must be >= 1")
    if not 0 < options.alpha < 1:
        problems.append(f"--alpha {options.alpha}: must be in (0, 1)")
    if problems:
        raise ConfigError(problems)
    return dataclasses.replace(
        options,
        num_samples=options.num_samples or DEFAULT_SAMPLES[options.toy],
        num_prompts=options.num_prompts or DEFAULT_PROMPTS[options.toy],
        batch_size=options.batch_size or DEFAULT_BATCH[options.toy],
    )


def _check_method(cfg: RunConfig) -> None:
    name = cfg.method.name
    if name == "none":
        raise ConfigError(["method=none drafts nothing: there is nothing to verify (choose a speculative method)"])
    implemented = [m for m in DRAFTERS.names() if m != "none"]
    if name not in implemented:
        raise ConfigError([f"method={name} is not implemented yet (implemented: {', '.join(implemented)})"])


def _toy_method(cfg: RunConfig) -> RunConfig:
    """draft_target on the toy target: self-speculation with its first layer unless set."""
    method = cfg.method
    if not isinstance(method, DraftTargetMethodConfig):
        return cfg
    if method.draft_path is not None:
        raise ConfigError(["--toy: method.draft_path is not used; the draft is the toy target's first layers"])
    layers = method.self_speculative_layers
    if layers is None:
        return dataclasses.replace(cfg, method=dataclasses.replace(method, self_speculative_layers=1))
    if layers > TOY_LAYERS:
        raise ConfigError([f"--toy: method.self_speculative_layers={layers} must be in 1..{TOY_LAYERS} "
                           f"(the toy target has {TOY_LAYERS} layers)"])
    return cfg


def _load(cfg: RunConfig, effective: EffectiveConfig,
          options: VerifyOptions) -> tuple[EngineSetup, list[PromptCase], str]:
    """The target and the prompt cases: a toy model and token prompts, or the configured model."""
    from specdec_cli.engine.runner import DTYPES

    dtype = torch.float32 if options.toy else DTYPES[cfg.model.dtype]
    device = "cpu" if options.toy else effective.device
    num_prompts = options.num_prompts or 1
    if options.toy:
        from specdec_cli.testing import toy_model

        target = toy_model(0, vocab_size=TOY_VOCAB, num_layers=TOY_LAYERS)
        params = _sampling_params(cfg)
        cases = [PromptCase(f"toy_{i}", p, params) for i, p in enumerate(TOY_PROMPTS[:num_prompts])]
        name = f"toy model (vocab {TOY_VOCAB}, {TOY_LAYERS} layers)"
    else:
        target, cases = _real_target(cfg, dtype, device, num_prompts)
        name = cfg.model.path or f"{cfg.model.name} (embedded)"
    setup = EngineSetup(
        target=target, device=torch.device(device), dtype=dtype, batch_size=options.batch_size or 1,
        rejection=effective.rejection, backend=effective.backend,
        draft_len_schedule=effective.draft_len_schedule or None,
    )
    return setup, cases, name


def _real_target(cfg: RunConfig, dtype: torch.dtype, device: str,
                 num_prompts: int) -> tuple[Transformer, list[PromptCase]]:
    from specdec_cli.engine.workload import build_requests
    from specdec_cli.models import load_model

    target, tokenizer = load_model(cfg.model.path, dtype=dtype, device=device)
    requests = build_requests(cfg.workload, cfg.sampler, tokenizer, chat=cfg.model.chat_template)
    cases = [
        PromptCase(r.id, tuple(r.prompt_token_ids), r.params, r.eos_token_ids) for r in requests[:num_prompts]
    ]
    return target, cases


def _sampling_params(cfg: RunConfig) -> SamplingParams:
    sampler = cfg.sampler
    return SamplingParams(temperature=sampler.temperature, top_k=sampler.top_k, top_p=sampler.top_p)


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
    from specdec_cli.testing import exact_sequence_law

    params = case.params
    law = exact_sequence_law(setup.target, list(case.token_ids), num_tokens, temperature=params.temperature,
                             top_k=params.top_k, top_p=params.top_p)
    return law.numpy()


def _notes(cfg: RunConfig, proposed: int) -> list[str]:
    notes = []
    if proposed == 0:
        notes.append("the speculative runs proposed no drafts: this check says nothing about acceptance")
    if cfg.sampler.temperature == 0:
        notes.append("greedy sampler: speculative and target-only outputs must be identical")
    return notes
