"""The contract every registered drafter must keep (see docs/DEVELOPER_GUIDE.md).

Each drafter in ``DRAFTERS`` needs an entry in ``CONTRACT_CONFIGS``; a new method that
forgets to add one fails ``test_every_drafter_is_covered``.
"""
from __future__ import annotations

import pytest
import torch

from learned_helpers import toy_checkpoint
from specdec_cli.config.schema import (
    DflashMethodConfig,
    DraftTargetMethodConfig,
    Eagle3MethodConfig,
    MethodConfig,
    MtpMethodConfig,
    NgramMethodConfig,
    NoneMethodConfig,
    PardMethodConfig,
    SuffixMethodConfig,
)
from specdec_cli.drafters import DRAFTERS, build_drafter
from specdec_cli.drafters.base import DrafterDeps, DraftRequest
from specdec_cli.sampling import expand_draft_probs, probs_from_logits
from specdec_cli.stats import fit
from specdec_cli.testing import toy_model
from test_dflash import toy_dflash_checkpoint
from test_pard import toy_pard_checkpoint

VOCAB = 16
NUM_SAMPLES = 3000

CONTRACT_CONFIGS: dict[str, MethodConfig] = {
    "none": NoneMethodConfig(),
    "ngram": NgramMethodConfig(min_n=1, max_n=3, num_draft_tokens=3),
    "suffix": SuffixMethodConfig(min_match_len=1, num_draft_tokens=3),
    "draft_target": DraftTargetMethodConfig(self_speculative_layers=1, num_draft_tokens=3),
    "eagle3": Eagle3MethodConfig(checkpoint=toy_checkpoint("eagle3"), num_draft_tokens=3),  # draft vocab 12 of 16
    "mtp": MtpMethodConfig(checkpoint=toy_checkpoint("mtp", reduced=False), num_draft_tokens=3),
    "pard": PardMethodConfig(checkpoint=toy_pard_checkpoint(), num_draft_tokens=3),
    "dflash": DflashMethodConfig(checkpoint=toy_dflash_checkpoint(), num_draft_tokens=3),
}


@pytest.fixture(scope="module")
def target():
    return toy_model(0, vocab_size=VOCAB, num_layers=2)


def build(target, name: str, num_slots: int):
    deps = DrafterDeps(target=target, num_slots=num_slots, max_seq_len=64, vocab_size=VOCAB,
                       device=torch.device("cpu"), dtype=torch.float32)
    return build_drafter(CONTRACT_CONFIGS[name], deps)


def test_every_drafter_is_covered() -> None:
    assert sorted(CONTRACT_CONFIGS) == DRAFTERS.names()


CONTEXT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]


def requests_for(num: int, temperature: float, seed0: int = 0) -> list[DraftRequest]:
    return [DraftRequest(slot=i, token_ids=list(CONTEXT), temperature=temperature, top_k=0, top_p=1.0,
                         generator=torch.Generator().manual_seed(seed0 + i)) for i in range(num)]


@pytest.mark.parametrize("name", [n for n in CONTRACT_CONFIGS if n != "none"])
def test_q_provenance(target, name: str) -> None:
    """Drafting many times on one context reproduces the q the drafter reports."""
    drafter = build(target, name, NUM_SAMPLES)
    for slot in range(NUM_SAMPLES):
        drafter.add_request(slot, CONTEXT)
    proposal = drafter.propose(requests_for(NUM_SAMPLES, temperature=1.0), k=2)
    if proposal.draft_probs is None:  # retrieval drafter: deterministic, q is one-hot
        assert (proposal.tokens == proposal.tokens[0]).all()
        return
    q = expand_draft_probs(proposal.draft_probs, drafter.d2t, VOCAB)  # draft vocabulary -> target ids
    first_q = q[:, 0]
    assert torch.allclose(first_q, first_q[0].expand_as(first_q))  # same context -> same q
    counts = torch.bincount(proposal.tokens[:, 0], minlength=VOCAB)
    result = fit(counts, first_q[0])
    assert result.passed, result
    # second position: the reported q is the filtered draft distribution given the first draft
    second_q = q[:, 1]
    picked = proposal.tokens[:, 1]
    assert bool((second_q.gather(1, picked[:, None]) > 0).all())
    # pool draws by their reported q: the sum of q rows is the law of the pooled draws
    counts = torch.bincount(picked, minlength=VOCAB)
    assert fit(counts, second_q.double().mean(0)).passed


@pytest.mark.parametrize("name", [n for n in CONTRACT_CONFIGS if n != "none"])
def test_greedy_q_is_one_hot(target, name: str) -> None:
    drafter = build(target, name, 2)
    for slot in range(2):
        drafter.add_request(slot, CONTEXT)
    proposal = drafter.propose(requests_for(2, temperature=0.0), k=3)
    if proposal.draft_probs is not None:
        q = expand_draft_probs(proposal.draft_probs, drafter.d2t, VOCAB)
        assert torch.equal(q.max(-1).values, torch.ones_like(q.max(-1).values))
        assert torch.equal(q.argmax(-1), proposal.tokens)


def test_model_drafter_q_matches_its_model(target) -> None:
    """The q of draft_target is exactly probs_from_logits of the draft model on the context."""
    drafter = build(target, "draft_target", 1)
    drafter.add_request(0, CONTEXT)
    proposal = drafter.propose(requests_for(1, temperature=0.7), k=2)
    draft_model = target.truncated(1)
    for position in range(2):
        context = CONTEXT + proposal.tokens[0, :position].tolist()
        cache = draft_model.new_cache(1, 64)
        with torch.inference_mode():
            logits = draft_model(cache, [0], [torch.tensor(context)], logits_for="last").logits
        expected = probs_from_logits(logits, torch.tensor([0.7]))
        assert torch.allclose(proposal.draft_probs[0, position], expected[0], atol=1e-6)
