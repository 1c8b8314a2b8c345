"""Toy EAGLE-3 and MTP drafters for the toy target (random heads written as real checkpoints), and the
toy engine the end-to-end drafter tests run them in."""
from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import torch
from rich.console import Console

from specdec_cli.config.schema import MethodConfig, NoneMethodConfig
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.drafters.eagle3 import save_eagle3
from specdec_cli.drafters.mtp import save_mtp
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.runner import run_requests
from specdec_cli.models import Transformer
from specdec_cli.stats import fit
from specdec_cli.testing import toy_model
from specdec_cli.train.features import FeatureExtractor, OnlineFeatures, Sequences
from specdec_cli.train.heads import new_eagle3, new_mtp
from specdec_cli.train.tasks import HeadTask
from specdec_cli.train.trainer import Trainer, TrainOptions

VOCAB = 16
#: a draft vocabulary of 12 of the 16 toy ids (exercises d2t: draft id != target id)
DRAFT_IDS = torch.tensor([0, 1, 2, 3, 5, 6, 8, 9, 10, 12, 13, 15])
#: EAGLE-3 low/mid/high features on the 2-layer toy target (output-of-layer ids)
TOY_LAYERS = (0, 1, 1)


def toy_target() -> Transformer:
    return toy_model(0, vocab_size=VOCAB, num_layers=2)


def toy_checkpoint(method: str, target: Optional[Transformer] = None, directory: Optional[Path] = None, *,
                   reduced: bool = True, seed: int = 1) -> str:
    """A random ``method`` head for ``target`` (default: the toy target) saved in ``directory``
    (default: a temporary directory removed at exit); ``reduced``: the 12-token draft vocabulary."""
    target = target if target is not None else toy_target()
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix=f"specdec-toy-{method}-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
    used = DRAFT_IDS if reduced else torch.arange(VOCAB)
    if method == "eagle3":
        save_eagle3(new_eagle3(target, used, hidden_layers=TOY_LAYERS, seed=seed), directory)
    else:
        save_mtp(new_mtp(target, used if reduced else None, seed=seed), directory,
                 target_num_layers=target.arch.num_layers)
    return str(directory)


# ---------------------------------------------------------------- the engine on a toy target
def make_engine(target: Transformer, method: MethodConfig, *, batch: int = 4, rejection: bool = True,
                schedule: Optional[dict[int, int]] = None) -> SpecEngine:
    deps = DrafterDeps(target=target, num_slots=batch, max_seq_len=96, vocab_size=VOCAB,
                       device=torch.device("cpu"), dtype=torch.float32)
    options = EngineOptions(max_batch_size=batch, max_seq_len=96, prefill_chunk=5,
                            max_draft_len=method.num_draft_tokens, draft_len_schedule=schedule, rejection=rejection)
    return SpecEngine(target, build_drafter(method, deps), options)


def generate(engine: SpecEngine, prompts: list[list[int]], params: list[SamplingParams],
             max_new: int) -> list[list[int]]:
    requests = [Request(id=str(i), prompt_token_ids=list(p), params=par, max_new_tokens=max_new)
                for i, (p, par) in enumerate(zip(prompts, params))]
    run_requests(engine, requests)
    return [r.output_token_ids for r in requests]


def assert_follows_law(samples: torch.Tensor, law: torch.Tensor) -> None:
    """Sampled sequences [N, n] follow ``law`` [V]*n: the joint law and every marginal (chi-square + TV)."""
    num_tokens = samples.shape[1]
    index = torch.zeros(samples.shape[0], dtype=torch.int64)
    for position in range(num_tokens):
        index = index * VOCAB + samples[:, position]
    joint = fit(torch.bincount(index, minlength=law.numel()), law.flatten())
    assert joint.p_value > 1e-4, joint
    for position in range(num_tokens):
        marginal = law.sum(dim=[d for d in range(num_tokens) if d != position])
        result = fit(torch.bincount(samples[:, position], minlength=VOCAB), marginal)
        assert result.passed, (position, result)


def trained_toy_checkpoint(method: str, target: Transformer, directory: Path, *, steps: int = 30) -> str:
    """A ``method`` head distilled for a few seconds on the toy target's own samples (so that the engine
    tests see drafts accepted under every sampler), written to ``directory / method``."""
    prompts = [torch.randint(0, VOCAB, (4,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(40)]
    responses = generate(make_engine(target, NoneMethodConfig(), batch=16), prompts,
                         [SamplingParams(temperature=1.0, seed=i) for i in range(40)], 24)
    sequences = Sequences.from_pairs(list(zip(prompts, responses)))
    if method == "eagle3":
        head = new_eagle3(target, DRAFT_IDS, hidden_layers=TOY_LAYERS, seed=1)
    else:
        head = new_mtp(target, None)
    task = HeadTask(head, target, steps=2, step_weight=0.8)
    options = TrainOptions(steps=steps, batch_size=8, lr=1e-2, warmup_steps=3, min_lr_ratio=0.1, weight_decay=0.0,
                           grad_clip=1.0, eval_every=0, checkpoint_every=steps, eval_k=2, resume=False)
    Trainer(task, OnlineFeatures(FeatureExtractor(target, task.feature_layers, 28), sequences), sequences,
            train_indices=list(range(40)), eval_indices=[], options=options, out_dir=directory, artifact=method,
            hidden_size=target.arch.hidden_size, device=torch.device("cpu"), console=Console(quiet=True)).run()
    return str(directory / method)
