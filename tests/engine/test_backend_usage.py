"""metrics.backend_usage counts the rejection kernel each group actually ran; with rejection.backend=flashinfer,
seeded and unseeded rows both go to flashinfer's chain kernel (a fake module stands in for it on CPU)."""
from __future__ import annotations

import sys
import types

import torch

from specdec_cli.config.schema import NgramMethodConfig
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.sampling import rejection_sample
from specdec_cli.sampling.backend import philox_seeds
from specdec_cli.testing import toy_model

PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4, 5], [6, 7, 6, 7, 6], [1, 1, 2, 2, 1, 1]]
SAMPLERS = [SamplingParams(temperature=1.0, seed=11), SamplingParams(temperature=0.9),
            SamplingParams(temperature=1.0, seed=12), SamplingParams()]


def run(backend: str) -> SpecEngine:
    target = toy_model(0, vocab_size=16, num_layers=2)
    method = NgramMethodConfig(min_n=1, max_n=3, num_draft_tokens=3)
    drafter = build_drafter(method, DrafterDeps(target=target, num_slots=4, max_seq_len=48, vocab_size=16,
                                                device=target.device, dtype=target.dtype))
    engine = SpecEngine(target, drafter, EngineOptions(max_batch_size=4, max_seq_len=48, max_draft_len=3,
                                                       backend=backend))
    for i, (prompt, params) in enumerate(zip(PROMPTS, SAMPLERS)):
        engine.add_request(Request(id=str(i), prompt_token_ids=prompt, params=params, max_new_tokens=12))
    while engine.has_work():
        engine.step()
    return engine


def test_torch_backend_counts_every_rejection_group() -> None:
    usage = run("torch").stats.summary()["backend_usage"]
    assert usage["torch"] > 0 and usage["flashinfer"] == 0


def fake_flashinfer(monkeypatch) -> list[dict]:
    """flashinfer.sampling.chain_speculative_sampling recording its calls, computing with the torch kernel."""
    calls: list[dict] = []

    def chain_speculative_sampling(draft_probs, draft_token_ids, target_probs, deterministic=True, generator=None,
                                   seed=None, offset=None):
        calls.append(dict(rows=draft_token_ids.shape[0], seed=seed.clone(), offset=offset.clone(),
                          generator=generator))
        tokens, emitted = rejection_sample(target_probs, draft_probs, draft_token_ids.long())
        return tokens.int(), torch.zeros_like(emitted), (emitted - 1).int()

    sampling = types.ModuleType("flashinfer.sampling")
    sampling.chain_speculative_sampling = chain_speculative_sampling
    package = types.ModuleType("flashinfer")
    package.sampling = sampling
    monkeypatch.setitem(sys.modules, "flashinfer", package)
    monkeypatch.setitem(sys.modules, "flashinfer.sampling", sampling)
    return calls


def test_flashinfer_backend_takes_seeded_and_unseeded_rows(monkeypatch) -> None:
    calls = fake_flashinfer(monkeypatch)
    engine = run("flashinfer")
    usage = engine.stats.summary()["backend_usage"]
    assert usage == {"torch": 0, "flashinfer": len(calls)} and calls
    assert max(call["rows"] for call in calls) >= 2  # seeded and unseeded rows in one call
    for call in calls:
        assert call["seed"].shape == call["offset"].shape == (call["rows"],)
        assert call["seed"].dtype == call["offset"].dtype == torch.int64 and call["generator"] is None


def test_a_seeded_row_gets_the_same_philox_seed_in_any_batch() -> None:
    """A seeded row's flashinfer seed comes from its own generator: independent of its batch position and of
    the other rows (unseeded rows draw from the default RNG)."""
    alone = philox_seeds([torch.Generator(device="cpu").manual_seed(5)], 1, torch.device("cpu"))
    mixed = philox_seeds([None, torch.Generator(device="cpu").manual_seed(9), torch.Generator(device="cpu").manual_seed(5)],
                         3, torch.device("cpu"))
    assert mixed[2] == alone[0] and mixed[1] != alone[0]
