"""PARD: one causal forward over [new tokens, masks], mask KV dropped, loading, engine losslessness.

Also the engine helpers shared with test_dflash.py (``make_engine``, ``check_law``, ``check_staggered``).
"""
from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec_cli.config.schema import MethodConfig, PardMethodConfig
from specdec_cli.drafters import build_drafter, learned
from specdec_cli.drafters.base import DrafterDeps, DraftRequest
from specdec_cli.drafters.pard import PardDrafter, load_pard, save_pard
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.runner import run_requests
from specdec_cli.errors import ConfigError
from specdec_cli.sampling import probs_from_logits
from specdec_cli.stats import fit
from specdec_cli.testing import exact_sequence_law, toy_model

VOCAB = 16
MASK = 15
PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 6, 7], [9, 9, 9, 9, 9, 9, 3], [4, 3, 2, 1, 0, 4, 3, 2, 1, 0, 4, 3]]
GREEDY = SamplingParams(temperature=0.0)
SAMPLERS = {
    "temperature": dict(temperature=1.0),
    "topk": dict(temperature=1.0, top_k=4),
    "topp": dict(temperature=0.8, top_p=0.7),
    "argmax": dict(temperature=1.0),  # with draft_policy=argmax
}


def toy_pard_checkpoint(directory: Optional[Path] = None) -> str:
    """The toy target's first layer (with its head) as a PARD draft with mask token 15, saved in
    ``directory`` (default: a temporary directory removed at exit)."""
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="specdec-toy-pard-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
    save_pard(toy_model(0, vocab_size=VOCAB, num_layers=2).truncated(1), directory, mask_token_id=MASK)
    return str(directory)


# ---------------------------------------------------------------- engine helpers (PARD and DFlash)
def make_engine(target, method: Optional[MethodConfig], *, batch: int, prefill_chunk: int = 5,
                schedule: Optional[dict[int, int]] = None) -> SpecEngine:
    """``method=None``: target-only decoding."""
    deps = DrafterDeps(target=target, num_slots=batch, max_seq_len=64, vocab_size=VOCAB,
                       device=torch.device("cpu"), dtype=torch.float32)
    options = EngineOptions(max_batch_size=batch, max_seq_len=64, prefill_chunk=prefill_chunk,
                            max_draft_len=method.num_draft_tokens if method else 0, draft_len_schedule=schedule)
    return SpecEngine(target, build_drafter(method, deps) if method else None, options)


def generate(engine: SpecEngine, prompts: list[list[int]], params, max_new: int) -> list[list[int]]:
    params_list = params if isinstance(params, list) else [params] * len(prompts)
    requests = [Request(id=str(i), prompt_token_ids=list(p), params=par, max_new_tokens=max_new)
                for i, (p, par) in enumerate(zip(prompts, params_list))]
    run_requests(engine, requests)
    return [r.output_token_ids for r in requests]


def check_law(target, method: MethodConfig, sampler: str, num: int = 3000) -> None:
    """The first 3 tokens of speculative sampling (rejection on) follow the target-only law (joint and
    marginals: chi-square + TV)."""
    prompt, params = [3, 1, 4, 1, 5], SAMPLERS[sampler]
    law = exact_sequence_law(target, prompt, 3, **params)
    engine = make_engine(target, method, batch=64)
    samples = torch.tensor(generate(engine, [prompt] * num, [SamplingParams(seed=i, **params) for i in range(num)], 3))
    assert 0 < engine.stats.accepted_drafts < engine.stats.proposed_drafts
    index = (samples[:, 0] * VOCAB + samples[:, 1]) * VOCAB + samples[:, 2]
    joint = fit(torch.bincount(index, minlength=law.numel()), law.flatten())
    assert joint.p_value > 1e-4, joint
    for position in range(3):
        marginal = law.sum(dim=[d for d in range(3) if d != position])
        result = fit(torch.bincount(samples[:, position], minlength=VOCAB), marginal)
        assert result.passed, (position, result)


def check_staggered(target, method: MethodConfig) -> None:
    """Requests arrive while others generate (3 slots for 4 requests, small prefill chunks): steps with only
    context requests, mixed context/generation batches, and K dropping to 0 at batch size 3 and coming
    back ({2: K}); every greedy output equals the request decoded alone."""
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
    alone = make_engine(target, None, batch=1)
    for req in requests:
        assert generate(alone, [req.prompt_token_ids], GREEDY, req.max_new_tokens)[0] == req.output_token_ids


# ---------------------------------------------------------------- PARD
@pytest.fixture(scope="module")
def target():
    return toy_model(0, vocab_size=VOCAB, num_layers=2)


@pytest.fixture(scope="module")
def checkpoint() -> str:
    return toy_pard_checkpoint()


def pard_drafter(target, path: str, **cfg) -> PardDrafter:
    deps = DrafterDeps(target=target, num_slots=2, max_seq_len=64, vocab_size=VOCAB,
                       device=torch.device("cpu"), dtype=torch.float32)
    return build_drafter(PardMethodConfig(checkpoint=path, **cfg), deps)


def draft_request(tokens: list[int], temperature: float = 0.7) -> DraftRequest:
    return DraftRequest(slot=0, token_ids=list(tokens), temperature=temperature, top_k=0, top_p=1.0,
                        generator=torch.Generator().manual_seed(0))


def test_q_is_the_model_on_masks_and_masks_leave_the_cache(target, checkpoint) -> None:
    """q of draft j = probs_from_logits of the draft model at [context, mask x (k-1)] position; after each
    call the slot caches exactly the committed tokens; rejected drafts are rewound (shared prefix)."""
    drafter = pard_drafter(target, checkpoint)
    model = target.truncated(1)
    drafter.add_request(0, [])
    for tokens in ([3, 1, 4, 1, 5], [3, 1, 4, 1, 5, 9, 2], [3, 1, 4, 1, 6, 6]):  # the last one rejects 5, 9, 2
        proposal = drafter.propose([draft_request(tokens)], 3)
        assert drafter.cache.length(0) == len(tokens) and drafter.cached_tokens[0] == tokens
        cache = model.new_cache(1, 64)
        with torch.inference_mode():
            logits = model(cache, [0], [torch.tensor(tokens + [MASK, MASK])], logits_for=[3]).logits
        assert torch.allclose(proposal.draft_probs[0], probs_from_logits(logits, torch.full((3,), 0.7)), atol=1e-6)


def test_mask_token_id_override_and_lookup(checkpoint, tmp_path: Path) -> None:
    assert load_pard(checkpoint)[1] == MASK
    assert load_pard(checkpoint, mask_token_id=7)[1] == 7
    config = json.loads((Path(checkpoint) / "config.json").read_text())
    config["mask_token_id"] = [config.pop("pard_token")] * 3  # one id per depth, all equal
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(Path(checkpoint) / "model.safetensors", tmp_path)
    assert load_pard(tmp_path)[1] == MASK


def broken(checkpoint: str, directory: Path, *, config: Optional[dict] = None, drop: Optional[str] = None,
           reshape: Optional[str] = None) -> str:
    stored = json.loads((Path(checkpoint) / "config.json").read_text())
    stored.update(config or {})
    (directory / "config.json").write_text(json.dumps({k: v for k, v in stored.items() if v is not None}))
    tensors = load_file(str(Path(checkpoint) / "model.safetensors"))
    tensors.pop(drop, None)
    if reshape:
        tensors[reshape] = tensors[reshape][:, :-1].contiguous()
    save_file(tensors, str(directory / "model.safetensors"))
    return str(directory)


@pytest.mark.parametrize("change,message", [
    (dict(config={"pard_token": None}), "no mask token id (none of pard_token, mask_token_id, ptd_token_id); "
                                        "pass one with method.mask_token_id=<id>"),
    (dict(config={"pard_token": VOCAB}), "pard_token=16 must be one token id in [0, 16)"),
    (dict(drop="model.layers.0.self_attn.q_proj.weight"), "model.layers.0.self_attn.q_proj.weight"),
    (dict(reshape="model.layers.0.mlp.up_proj.weight"), "tensor model.layers.0.mlp.up_proj.weight has shape"),
    (dict(config={"model_type": "gpt2"}), "model_type='gpt2' is not supported"),
])
def test_malformed_checkpoints_are_refused(target, checkpoint, tmp_path: Path, change: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        pard_drafter(target, broken(checkpoint, tmp_path, **change))
    assert message in str(err.value) and str(tmp_path) in str(err.value), str(err.value)


def test_without_a_checkpoint_the_missing_shipped_draft_is_explained(target, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(learned, "ASSETS", tmp_path)  # as for a target without a shipped draft
    with pytest.raises(ConfigError) as err:
        pard_drafter(target, None)
    assert len(err.value.violations) == 1
    assert "no shipped draft exists yet" in str(err.value) and "method.checkpoint=" in str(err.value)


# ---------------------------------------------------------------- through the engine
def method(checkpoint: str, **kwargs) -> PardMethodConfig:
    return PardMethodConfig(checkpoint=checkpoint, **{"num_draft_tokens": 3, **kwargs})


def test_greedy_speculative_equals_autoregressive(target, checkpoint) -> None:
    baseline = generate(make_engine(target, None, batch=2), PROMPTS, GREEDY, 24)
    engine = make_engine(target, method(checkpoint), batch=3)
    assert generate(engine, PROMPTS, GREEDY, 24) == baseline
    assert engine.stats.accepted_drafts > 0 and engine.stats.guard_fallbacks == 0


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_sampled_output_follows_target_law(target, checkpoint, sampler: str) -> None:
    policy = "argmax" if sampler == "argmax" else "sample"
    check_law(target, method(checkpoint, num_draft_tokens=2, draft_policy=policy), sampler)


def test_staggered_arrivals_and_context_only_steps(target, checkpoint) -> None:
    check_staggered(target, method(checkpoint))
