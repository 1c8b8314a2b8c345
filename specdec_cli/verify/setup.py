"""What ``specdec verify`` checks: its options, the configuration under test, the target and prompts.

``--toy`` replaces the configured model with a small random target (``specdec_cli.testing``)
and token prompts; draft_target then self-speculates with the toy target's first layer.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

from specdec_cli.config.compose import compose_config
from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.schema import DraftTargetMethodConfig, RunConfig
from specdec_cli.config.validate import resolve
from specdec_cli.drafters import DRAFTERS
from specdec_cli.engine.request import SamplingParams
from specdec_cli.engine.workload import build_requests
from specdec_cli.errors import ConfigError
from specdec_cli.models import Transformer, load_model
from specdec_cli.models.loading import COMPUTE_DTYPES
from specdec_cli.models.quantize import quantize_model
from specdec_cli.testing import toy_model
from specdec_cli.verify.samples import EngineSetup, PromptCase

TOY_VOCAB = 32
TOY_LAYERS = 2
TOY_PROMPTS = ((3, 1, 4, 1, 5, 9, 2, 6), (1, 2, 3, 4, 1, 2, 3, 4, 1, 2), (7, 7, 7, 0, 7, 7, 7, 0, 7))
DEFAULT_SAMPLES = {False: 400, True: 1000}  # per prompt and side; keyed by toy
DEFAULT_PROMPTS = {False: 3, True: 2}
DEFAULT_BATCH = {False: 32, True: 128}


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


def with_defaults(options: VerifyOptions) -> VerifyOptions:
    """``options`` checked (every problem at once), with each None replaced by its default."""
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


def verify_config(overrides: list[str], options: VerifyOptions) -> tuple[RunConfig, EffectiveConfig]:
    """The configuration under test, validated; a speculative method is required."""
    cfg = compose_config(overrides)
    effective = resolve(cfg)
    _check_method(cfg)
    return (_toy_method(cfg) if options.toy else cfg), effective


def load_target(cfg: RunConfig, effective: EffectiveConfig,
                options: VerifyOptions) -> tuple[EngineSetup, list[PromptCase], str]:
    """The target and the prompt cases: a toy model and token prompts, or the configured model."""
    dtype = torch.float32 if options.toy else COMPUTE_DTYPES[cfg.model.dtype]
    device = "cpu" if options.toy else effective.device
    num_prompts = options.num_prompts or 1
    if options.toy:
        target = toy_model(0, vocab_size=TOY_VOCAB, num_layers=TOY_LAYERS)
        params = _sampling_params(cfg)
        cases = [PromptCase(f"toy_{i}", p, params) for i, p in enumerate(TOY_PROMPTS[:num_prompts])]
        name = f"toy model (vocab {TOY_VOCAB}, {TOY_LAYERS} layers)"
    else:
        target, cases = _real_target(cfg, dtype, device, num_prompts)
        name = cfg.model.path or f"{cfg.model.name} (embedded)"
    setup = EngineSetup(
        target=target, device=torch.device(device), dtype=dtype, batch_size=options.batch_size or 1,
        rejection=effective.rejection, backend=effective.backend, verification=effective.verification,
        # an explicit schedule only: verify drafts at every batch size, so the CPU auto schedule does not apply
        draft_len_schedule=effective.draft_len_schedule if cfg.method.draft_len_schedule else None,
        model_dtype="float32" if options.toy else cfg.model.dtype,
        head_dtype=None if options.toy else effective.head_dtype,
        tree_nodes=effective.tree_nodes, sampled_tree_nodes=effective.sampled_tree_nodes,
    )
    return setup, cases, name


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


def _real_target(cfg: RunConfig, dtype: torch.dtype, device: str,
                 num_prompts: int) -> tuple[Transformer, list[PromptCase]]:
    target, tokenizer = load_model(cfg.model.path, dtype=dtype, device=device)
    if cfg.model.dtype == "int8":
        quantize_model(target)
    requests = build_requests(cfg.workload, cfg.sampler, tokenizer, chat=cfg.model.chat_template)
    cases = [
        PromptCase(r.id, tuple(r.prompt_token_ids), r.params, r.eos_token_ids) for r in requests[:num_prompts]
    ]
    return target, cases


def _sampling_params(cfg: RunConfig) -> SamplingParams:
    sampler = cfg.sampler
    return SamplingParams(temperature=sampler.temperature, top_k=sampler.top_k, top_p=sampler.top_p)
