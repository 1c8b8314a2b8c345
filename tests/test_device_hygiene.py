"""Device hygiene: every tensor the engine creates names the model's device.

The target and drafter load first; then the engine runs under ``implicit_device_forbidden``, a torch function
mode that fails any tensor factory called without an explicit ``device=`` (what ``torch.set_default_device``
would silently redirect). A tensor created on the implicit device would land on the CPU next to CUDA
logits on a GPU run; here it fails loudly, for every method and sampler (greedy, temperature and a mixed
batch of seeded and unseeded rows, with rejection sampling on).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

sys.path.insert(0, str(Path(__file__).parent / "drafters"))

from specdec_cli.config import schema  # noqa: E402
from specdec_cli.engine.engine import EngineOptions, SpecEngine  # noqa: E402
from specdec_cli.engine.request import Request, SamplingParams  # noqa: E402
from toys import build, toy_checkpoint, toy_dflash_checkpoint, toy_pard_checkpoint, toy_target  # noqa: E402

K = 3
METHODS = {
    "none": lambda: None,
    "ngram": lambda: schema.NgramMethodConfig(min_n=1, max_n=3, num_draft_tokens=K),
    "suffix": lambda: schema.SuffixMethodConfig(min_match_len=1, num_draft_tokens=K),
    "draft_target": lambda: schema.DraftTargetMethodConfig(self_speculative_layers=1, num_draft_tokens=K),
    "eagle3": lambda: schema.Eagle3MethodConfig(checkpoint=toy_checkpoint("eagle3"), num_draft_tokens=K),
    "mtp": lambda: schema.MtpMethodConfig(checkpoint=toy_checkpoint("mtp"), num_draft_tokens=K),
    "pard": lambda: schema.PardMethodConfig(checkpoint=toy_pard_checkpoint(), num_draft_tokens=K),
    "dflash": lambda: schema.DflashMethodConfig(checkpoint=toy_dflash_checkpoint(), num_draft_tokens=K),
}
SAMPLERS = {
    "greedy": [SamplingParams()] * 3,
    "temperature": [SamplingParams(temperature=1.0, seed=i) for i in range(3)],
    "mixed": [SamplingParams(), SamplingParams(temperature=0.8, top_k=5, seed=7),
              SamplingParams(temperature=1.0, top_p=0.9)],
}
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7], [9, 9, 9, 9, 3]]


class ImplicitDeviceError(AssertionError):
    pass


class implicit_device_forbidden(TorchFunctionMode):
    """Within it, a tensor factory (torch.tensor, zeros, arange, ...) without ``device=`` raises."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _device_constructors() and kwargs.get("device") is None:
            raise ImplicitDeviceError(f"torch.{getattr(func, '__name__', func)} called without device=")
        return func(*args, **kwargs)


def test_the_mode_catches_an_implicit_factory() -> None:
    with implicit_device_forbidden():
        torch.zeros(2, device="cpu")
        with pytest.raises(ImplicitDeviceError):
            torch.tensor([1, 2])


def run(method: str, sampler: str) -> list[list[int]]:
    target = toy_target()
    config = METHODS[method]()
    options = EngineOptions(max_batch_size=2, max_seq_len=64, prefill_chunk=4,
                            max_draft_len=config.num_draft_tokens if config else 0)
    drafter = build(target, config, 2, 64) if config else None  # loading: outside the check
    requests = [Request(id=str(i), prompt_token_ids=p, params=s, max_new_tokens=10)
                for i, (p, s) in enumerate(zip(PROMPTS, SAMPLERS[sampler]))]
    with implicit_device_forbidden():
        engine = SpecEngine(target, drafter, options)
        for request in requests:
            engine.add_request(request)
        while engine.has_work():
            engine.step()
    assert all(r.generator is None or r.generator.device == target.device for r in requests)
    return [r.output_token_ids for r in requests]


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("method", list(METHODS))
def test_every_tensor_names_the_model_device(method: str, sampler: str) -> None:
    outputs = run(method, sampler)
    assert all(len(out) == 10 for out in outputs)


@pytest.fixture(scope="module")
def embedded():
    from specdec_cli.models import load_model

    return load_model(None)


@pytest.mark.realmodel
@pytest.mark.parametrize("method", ["draft_target", "eagle3", "mtp", "pard", "dflash"])
def test_learned_drafters_on_the_embedded_target(embedded, method: str) -> None:
    """The shipped drafters (checkpoint None) on the real target: a short mixed-sampler run under the check."""
    from specdec_cli.drafters import build_drafter
    from specdec_cli.drafters.base import DrafterDeps

    target, tokenizer = embedded
    config = METHOD_SCHEMAS[method]()
    deps = DrafterDeps(target=target, num_slots=2, max_seq_len=96, vocab_size=target.arch.vocab_size,
                       device=target.device, dtype=target.dtype, tokenizer=tokenizer)
    drafter = build_drafter(config, deps)
    prompts = [tokenizer.encode("The capital of France is"), tokenizer.encode("def add(a, b):")]
    params = [SamplingParams(), SamplingParams(temperature=1.0, seed=3)]
    requests = [Request(id=str(i), prompt_token_ids=p, params=s, max_new_tokens=6)
                for i, (p, s) in enumerate(zip(prompts, params))]
    with implicit_device_forbidden():
        engine = SpecEngine(target, drafter, EngineOptions(max_batch_size=2, max_seq_len=96,
                                                           max_draft_len=config.num_draft_tokens))
        for request in requests:
            engine.add_request(request)
        while engine.has_work():
            engine.step()
    assert all(len(r.output_token_ids) == 6 for r in requests) and engine.stats.proposed_drafts > 0


METHOD_SCHEMAS = {"draft_target": schema.DraftTargetMethodConfig, "eagle3": schema.Eagle3MethodConfig,
                  "mtp": schema.MtpMethodConfig, "pard": schema.PardMethodConfig, "dflash": schema.DflashMethodConfig}
