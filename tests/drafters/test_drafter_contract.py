"""The contract every registered drafter keeps (see docs/DEVELOPER_GUIDE.md), run over ``DRAFTERS``.

Each drafter in the registry needs an entry in ``CONTRACT_CONFIGS`` (tiny in-process checkpoints for the
learned ones); a new method that forgets to add one fails ``test_every_drafter_is_covered``.
"""
from __future__ import annotations

import pytest
import torch

from specdec_cli.config import schema
from specdec_cli.drafters import DRAFTERS, learned
from specdec_cli.drafters.base import DraftRequest, Proposal
from specdec_cli.errors import ConfigError
from specdec_cli.verify.stats import fit
from toys import (CONTEXT, DRAFT_IDS, VOCAB, batch_params, build, toy_checkpoint, toy_dflash_checkpoint,
                  toy_pard_checkpoint)

NUM_SAMPLES = 3000
K = 3

# model drafters bare (suffix_enhancer=False): the contract is the drafter's own; the enhancer has its own tests
CONTRACT_CONFIGS: dict[str, schema.MethodConfig] = {
    "none": schema.NoneMethodConfig(),
    "ngram": schema.NgramMethodConfig(min_n=1, max_n=3, num_draft_tokens=K),
    "suffix": schema.SuffixMethodConfig(min_match_len=1, num_draft_tokens=K),
    "draft_target": schema.DraftTargetMethodConfig(self_speculative_layers=1, num_draft_tokens=K, suffix_enhancer=False),
    "eagle3": schema.Eagle3MethodConfig(checkpoint=toy_checkpoint("eagle3"), num_draft_tokens=K, suffix_enhancer=False),  # Vd 12 of 16
    "mtp": schema.MtpMethodConfig(checkpoint=toy_checkpoint("mtp", reduced=False), num_draft_tokens=K, suffix_enhancer=False),
    "mtp_reduced": schema.MtpMethodConfig(checkpoint=toy_checkpoint("mtp"), num_draft_tokens=K, suffix_enhancer=False),
    "pard": schema.PardMethodConfig(checkpoint=toy_pard_checkpoint(), num_draft_tokens=K, suffix_enhancer=False),
    "dflash": schema.DflashMethodConfig(checkpoint=toy_dflash_checkpoint(), num_draft_tokens=K, suffix_enhancer=False),
}
DRAFTING = [name for name in CONTRACT_CONFIGS if name != "none"]
#: other committed sequences that share a batch with CONTEXT (different lengths and tokens)
NEIGHBOURS = [[7, 7, 2, 9, 1, 4, 4, 0, 6], [5, 3, 5, 3, 5, 3, 8, 1, 12, 14, 2, 11, 3, 5, 3, 5, 3, 9, 2, 6]]


def drafter_with(target, name: str, contexts: list[list[int]]):
    """``name``'s drafter with request i (``contexts[i]``) in slot i."""
    drafter = build(target, CONTRACT_CONFIGS[name], len(contexts))
    for slot, context in enumerate(contexts):
        drafter.add_request(slot, context)
    return drafter


def propose(drafter, contexts: list[list[int]], k: int = K, **params) -> Proposal:
    requests = [DraftRequest(slot=slot, token_ids=list(c)) for slot, c in enumerate(contexts)]
    return drafter.propose(requests, k, batch_params(len(contexts), **params))


def test_every_drafter_is_covered() -> None:
    assert sorted({config.name for config in CONTRACT_CONFIGS.values()}) == DRAFTERS.names()


@pytest.mark.parametrize("name", DRAFTING)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_proposal_shape_ids_and_q(target, name: str, temperature: float) -> None:
    """At most k drafts, target-vocabulary ids, q in the draft vocabulary (d2t applied once, by the engine),
    every q row a distribution that gives its drafted token positive mass."""
    contexts = [CONTEXT, *NEIGHBOURS]
    drafter = drafter_with(target, name, contexts)
    proposal = propose(drafter, contexts, temperature=temperature, top_k=6)
    assert proposal.tokens.shape == (3, K) and proposal.tokens.dtype == torch.int64
    assert len(proposal.num_drafts) == 3 and all(0 <= n <= K for n in proposal.num_drafts)
    real = torch.arange(K)[None, :] < torch.tensor(proposal.num_drafts)[:, None]
    assert bool(((proposal.tokens[real] >= 0) & (proposal.tokens[real] < VOCAB)).all())
    if drafter.d2t is not None:  # a reduced vocabulary always reports q (never one-hot at target ids)
        assert proposal.draft_probs is not None
        assert set(proposal.tokens[real].tolist()) <= set(DRAFT_IDS.tolist())
    if proposal.draft_probs is not None:
        assert proposal.draft_probs.shape == (3, K, drafter.draft_vocab_size)
        sums = proposal.draft_probs[real].double().sum(-1)
        assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)
    q = proposal.target_probs(drafter.d2t, VOCAB)
    assert bool((q.gather(-1, proposal.tokens[..., None])[real] > 0).all())


@pytest.mark.parametrize("name", DRAFTING)
def test_sampling_reproduces_the_reported_q(target, name: str) -> None:
    """Drafting many times on one context reproduces the q the drafter reports (chi-square + TV), at the first
    position and pooled over the second (its q depends on the first draft)."""
    drafter = drafter_with(target, name, [CONTEXT] * NUM_SAMPLES)
    proposal = propose(drafter, [CONTEXT] * NUM_SAMPLES, k=2)
    if proposal.draft_probs is None:  # retrieval drafter: deterministic, q is one-hot
        assert (proposal.tokens == proposal.tokens[0]).all()
        return
    q = proposal.target_probs(drafter.d2t, VOCAB)
    first_q = q[:, 0]
    assert torch.allclose(first_q, first_q[0].expand_as(first_q))  # same context -> same q
    result = fit(torch.bincount(proposal.tokens[:, 0], minlength=VOCAB), first_q[0])
    assert result.passed, result
    pooled = fit(torch.bincount(proposal.tokens[:, 1], minlength=VOCAB), q[:, 1].double().mean(0))
    assert pooled.passed, pooled


@pytest.mark.parametrize("name", DRAFTING)
def test_greedy_params_give_one_hot_argmax_drafts(target, name: str) -> None:
    drafter = drafter_with(target, name, [CONTEXT, NEIGHBOURS[0]])
    proposal = propose(drafter, [CONTEXT, NEIGHBOURS[0]], temperature=0.0)
    if proposal.draft_probs is not None:
        q = proposal.draft_probs
        assert torch.equal(q.max(-1).values, torch.ones_like(q.max(-1).values))
        target_q = proposal.target_probs(drafter.d2t, VOCAB)
        assert torch.equal(target_q.argmax(-1), proposal.tokens)


@pytest.mark.parametrize("name", DRAFTING)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_seeded_drafts_do_not_depend_on_the_batch(target, name: str, temperature: float) -> None:
    """The same seeded request drafts bitwise the same tokens and q alone and inside a batch."""
    alone = propose(drafter_with(target, name, [CONTEXT]), [CONTEXT], temperature=temperature, seeds=[7])
    contexts = [NEIGHBOURS[0], CONTEXT, NEIGHBOURS[1]]
    batched = propose(drafter_with(target, name, contexts), contexts, temperature=temperature, seeds=[3, 7, 5])
    assert torch.equal(batched.tokens[1], alone.tokens[0])
    assert batched.num_drafts[1] == alone.num_drafts[0]
    if alone.draft_probs is not None:
        assert torch.equal(batched.draft_probs[1], alone.draft_probs[0])


@pytest.mark.parametrize("name", DRAFTING)
def test_a_reused_slot_drafts_like_a_fresh_drafter(target, name: str) -> None:
    """After remove_request and add_request, a slot keeps nothing of its previous request."""
    drafter = drafter_with(target, name, [NEIGHBOURS[1]])
    propose(drafter, [NEIGHBOURS[1]], seeds=[1])
    propose(drafter, [NEIGHBOURS[1] + [4, 4]], seeds=[2])
    drafter.remove_request(0, NEIGHBOURS[1] + [4, 4])
    drafter.add_request(0, CONTEXT)
    reused = propose(drafter, [CONTEXT], seeds=[9])
    fresh = propose(drafter_with(target, name, [CONTEXT]), [CONTEXT], seeds=[9])
    assert torch.equal(reused.tokens, fresh.tokens) and reused.num_drafts == fresh.num_drafts
    if fresh.draft_probs is not None:
        assert torch.equal(reused.draft_probs, fresh.draft_probs)


def test_one_hot_proposals_under_a_reduced_vocabulary_are_refused() -> None:
    """A one-hot proposal holds target ids: expanding it through d2t would put mass on the wrong ids."""
    proposal = Proposal.from_token_lists([[15, 4]], 2)
    assert torch.equal(proposal.target_probs(None, VOCAB).argmax(-1), torch.tensor([[15, 4]]))
    with pytest.raises(ValueError, match="must report draft_probs"):
        proposal.target_probs(DRAFT_IDS - torch.arange(12), VOCAB)


@pytest.mark.parametrize("name,option", [("eagle3", "checkpoint"), ("mtp", "checkpoint"), ("pard", "checkpoint"),
                                         ("dflash", "checkpoint"), ("draft_target", "draft_path")])
def test_a_missing_shipped_draft_is_one_clear_config_error(target, monkeypatch, tmp_path, name: str,
                                                           option: str) -> None:
    """No checkpoint given and none shipped (as for another target): one line saying how to get one."""
    monkeypatch.setattr(learned, "ASSETS", tmp_path)
    config = type(CONTRACT_CONFIGS[name])()
    with pytest.raises(ConfigError) as info:
        build(target, config, 1)
    (line,) = info.value.violations
    assert "no shipped draft exists yet" in line and f"specdec train method={name}" in line
    assert f"method.{option}=" in line
