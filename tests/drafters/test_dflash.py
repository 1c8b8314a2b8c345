"""DFlash: context K/V from target features, one non-causal block forward, loading (the contract is in
test_drafter_contract.py, decoding through the engine in test_drafters_in_engine.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec_cli.config.schema import DflashMethodConfig
from specdec_cli.drafters import dflash_drafter
from specdec_cli.drafters.base import DraftRequest, Proposal
from specdec_cli.drafters.dflash import load_dflash
from specdec_cli.drafters.dflash_drafter import DFlashDrafter
from specdec_cli.errors import ConfigError
from toys import MASK, VOCAB, batch_params, broken_copy, build, toy_dflash_checkpoint

CONTEXT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]


@pytest.fixture(scope="module")
def checkpoint() -> str:
    return toy_dflash_checkpoint()


def drafter_for(target, path: Optional[str], num_slots: int = 2) -> DFlashDrafter:
    return build(target, DflashMethodConfig(checkpoint=path, num_draft_tokens=3, suffix_enhancer=False), num_slots)


def propose(drafter: DFlashDrafter, tokens: list[int], k: int = 3, hidden: Optional[dict] = None,
            temperature: float = 1.0) -> Proposal:
    return drafter.propose([DraftRequest(slot=0, token_ids=list(tokens), target_hidden=hidden or {})], k,
                           batch_params(1, temperature))


def target_features(target, tokens: list[int], layers=(0, 1)) -> dict[int, torch.Tensor]:
    cache = target.new_cache(1, 64)
    with torch.inference_mode():
        out = target(cache, [0], [torch.tensor(tokens)], logits_for=[0], hidden_layers=layers)
    return out.hidden


def test_features_from_the_engine_equal_recomputed_ones(target, checkpoint) -> None:
    """Context = the committed tokens strictly before the anchor: features of CONTEXT[:-1] (as the engine
    hands them over, in two chunks) give the same q as the slow path that recomputes them."""
    given, recomputed = drafter_for(target, checkpoint), drafter_for(target, checkpoint)
    for drafter in (given, recomputed):
        drafter.add_request(0, CONTEXT)
    hidden = target_features(target, CONTEXT[:-1])
    first = propose(given, CONTEXT[:5], hidden={k: v[:4] for k, v in hidden.items()})
    assert given.cache.length(0) == 4 and first.num_drafts == [3]
    with_features = propose(given, CONTEXT, hidden={k: v[4:] for k, v in hidden.items()})
    without = propose(recomputed, CONTEXT)
    assert given.cache.length(0) == recomputed.cache.length(0) == len(CONTEXT) - 1
    assert torch.allclose(with_features.draft_probs, without.draft_probs, atol=1e-5)


def test_block_longer_than_the_draft_gives_ragged_drafts(target, monkeypatch) -> None:
    """K beyond block_size - 1: the draft proposes block_size - 1 tokens, and building it says so."""
    warnings: list[str] = []  # recorded at the logger: Hydra's logging set-up in other tests may disable capture
    monkeypatch.setattr(dflash_drafter.log, "warning", lambda message, *args: warnings.append(message % args))
    drafter = drafter_for(target, toy_dflash_checkpoint(block_size=3))
    assert len(warnings) == 1 and "proposes at most 2 tokens per step, not 3" in warnings[0]
    drafter.add_request(0, CONTEXT)
    proposal = propose(drafter, CONTEXT, 4, temperature=0.0)
    assert proposal.num_drafts == [2] and proposal.tokens.shape == (1, 4)
    q = proposal.draft_probs[0, :2]
    assert torch.equal(q.argmax(-1), proposal.tokens[0, :2]) and torch.equal(q.max(-1).values, torch.ones(2))


def test_published_layout_variants_load(target, checkpoint, tmp_path: Path) -> None:
    """Top-level config keys (no dflash_config) and a ``model.`` prefix on the tensors load the same draft."""
    config = json.loads((Path(checkpoint) / "config.json").read_text())
    config.update(config.pop("dflash_config"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(Path(checkpoint) / "model.safetensors"))
    save_file({f"model.{name}": t for name, t in tensors.items()}, str(tmp_path / "model.safetensors"))
    a, b = load_dflash(checkpoint, target), load_dflash(tmp_path, target)
    assert a.target_layers == b.target_layers == (0, 1) and a.mask_token_id == b.mask_token_id == MASK
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("change,message", [
    (dict(config={"mask_token_id": None}), "missing field 'mask_token_id'"),
    (dict(config={"target_layer_ids": [0, 7]}), "target_layer_ids=[0, 7] must be output-of-layer ids in 0..1"),
    (dict(config={"mask_token_id": VOCAB}), "mask_token_id=16 must be a token id"),
    (dict(config={"hidden_size": 64, "head_dim": 8}), "must equal the target's"),
    (dict(config={"layer_types": ["sliding_attention"], "use_sliding_window": True, "sliding_window": 8}),
     "sliding-window draft layers are not supported"),
    (dict(config={"final_logit_softcapping": 20.0}), "final_logit_softcapping is not supported"),
    (dict(drop="fc.weight"), "tensor 'fc.weight' missing"),
    (dict(reshape="layers.0.mlp.down_proj.weight"), "tensor 'layers.0.mlp.down_proj.weight' has shape"),
])
def test_malformed_checkpoints_are_refused(target, checkpoint, tmp_path: Path, change: dict, message: str) -> None:
    path = broken_copy(checkpoint, tmp_path, **change)
    with pytest.raises(ConfigError) as err:
        drafter_for(target, path)
    assert message in str(err.value), str(err.value)
    assert str(tmp_path) in str(err.value)  # the error names the file
