"""Shared fixtures of the end-to-end drafter tests: the engine on the toy target, the target-law check, and
heads trained for a few seconds (so that drafts are accepted under every sampler)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from rich.console import Console

from specdec_cli.config.schema import MethodConfig, NoneMethodConfig
from specdec_cli.engine.drive import run_to_completion
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.models import Transformer
from specdec_cli.verify.stats import check_three_token_law
from specdec_cli.testing import exact_sequence_law
from specdec_cli.train.features import FeatureExtractor, OnlineFeatures, Sequences
from specdec_cli.train.heads import new_eagle3, new_mtp
from specdec_cli.train.tasks import HeadTask
from specdec_cli.train.trainer import Trainer, TrainOptions
from toys import DRAFT_IDS, TOY_LAYERS, VOCAB, build

PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 6, 7], [9, 9, 9, 9, 9, 9, 3], [4, 3, 2, 1, 0, 4, 3, 2, 1, 0, 4, 3]]
GREEDY = SamplingParams(temperature=0.0)
SAMPLERS = {
    "temperature": dict(temperature=1.0),
    "topk": dict(temperature=1.0, top_k=4),
    "topp": dict(temperature=0.8, top_p=0.7),
    "argmax": dict(temperature=1.0),  # with draft_policy=argmax
}


def make_engine(target: Transformer, method: Optional[MethodConfig], *, batch: int, prefill_chunk: int = 5,
                rejection: bool = True, schedule: Optional[dict[int, int]] = None,
                cuda_graphs: bool = False) -> SpecEngine:
    """``method=None``: target-only decoding."""
    options = EngineOptions(max_batch_size=batch, max_seq_len=96, prefill_chunk=prefill_chunk,
                            max_draft_len=method.num_draft_tokens if method else 0, draft_len_schedule=schedule,
                            rejection=rejection, cuda_graphs=cuda_graphs)
    return SpecEngine(target, build(target, method, batch, 96) if method else None, options)


def generate(engine: SpecEngine, prompts: list[list[int]], params, max_new: int) -> list[list[int]]:
    """Outputs of ``prompts`` (``params``: one SamplingParams for all, or one per prompt)."""
    params_list = params if isinstance(params, list) else [params] * len(prompts)
    requests = [Request(id=str(i), prompt_token_ids=list(p), params=par, max_new_tokens=max_new)
                for i, (p, par) in enumerate(zip(prompts, params_list))]
    return [r.output_token_ids for r in run_to_completion(engine, requests)]


def check_law(target: Transformer, method: MethodConfig, sampler: str, num: int = 3000) -> None:
    """The first 3 tokens of speculative sampling (rejection on) follow the target-only law: the joint law
    and every marginal (chi-square + TV); some drafts are accepted, some rejected."""
    prompt, params = [3, 1, 4, 1, 5], SAMPLERS[sampler]
    law = exact_sequence_law(target, prompt, 3, **params)
    engine = make_engine(target, method, batch=64)
    samples = torch.tensor(generate(engine, [prompt] * num, [SamplingParams(seed=i, **params) for i in range(num)], 3))
    assert 0 < engine.stats.accepted_drafts < engine.stats.proposed_drafts
    assert engine.stats.guard_fallbacks == 0
    check_three_token_law(samples, law)


def check_staggered(target, method: MethodConfig) -> None:
    """Requests arrive while others generate (3 slots for 4 requests, small prefill chunks): steps with only
    context requests, mixed context/generation batches, and K dropping to 0 at batch size 3 and coming
    back ({2: K}); every greedy output equals the request decoded alone; a feature drafter never recomputes features."""
    engine = make_engine(target, method, batch=3, prefill_chunk=2, schedule={2: method.num_draft_tokens})
    requests = [Request(id=str(i), prompt_token_ids=p, params=GREEDY, max_new_tokens=n)
                for i, (p, n) in enumerate(zip(PROMPTS, [16, 9, 14, 7]))]
    engine.add_request(requests[0])
    engine.step()  # the only request is still in prefill: nothing to draft
    assert engine.stats.draft_forwards == 0
    while engine.stats.draft_forwards < 2:
        engine.step()
    engine.add_request(requests[1])
    engine.step()
    for req in requests[2:]:
        engine.add_request(req)
    while engine.has_work():
        engine.step()
    assert engine.stats.draft_forwards > 2 and engine.stats.guard_fallbacks == 0
    assert getattr(engine.drafter, "recomputed", 0) == 0
    alone = make_engine(target, None, batch=1)
    for req in requests:
        assert generate(alone, [req.prompt_token_ids], GREEDY, req.max_new_tokens)[0] == req.output_token_ids


def trained_toy_checkpoint(method: str, target: Transformer, directory: Path, *, steps: int = 30) -> str:
    """An EAGLE-3 or MTP head distilled for a few seconds on the toy target's own samples (so that the engine
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
