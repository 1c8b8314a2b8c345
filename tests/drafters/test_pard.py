"""PARD: one causal forward over [new tokens, masks], mask KV dropped, loading (the contract is in
test_drafter_contract.py, decoding through the engine in test_drafters_in_engine.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

import pytest
import torch

from specdec_cli.config.schema import PardMethodConfig
from specdec_cli.drafters.base import DraftRequest
from specdec_cli.drafters.pard import PardDrafter, load_pard
from specdec_cli.errors import ConfigError
from specdec_cli.sampling import probs_from_logits
from toys import MASK, VOCAB, batch_params, broken_copy, build, toy_pard_checkpoint


@pytest.fixture(scope="module")
def checkpoint() -> str:
    return toy_pard_checkpoint()


def pard_drafter(target, path: Optional[str], **cfg) -> PardDrafter:
    return build(target, PardMethodConfig(checkpoint=path, **{"suffix_enhancer": False, **cfg}), 2)


def test_q_is_the_model_on_masks_and_masks_leave_the_cache(target, checkpoint) -> None:
    """q of draft j = probs_from_logits of the draft model at [context, mask x (k-1)] position; after each
    call the slot caches exactly the committed tokens; rejected drafts are rewound (shared prefix)."""
    drafter = pard_drafter(target, checkpoint)
    model = target.truncated(1)
    drafter.add_request(0, [])
    for tokens in ([3, 1, 4, 1, 5], [3, 1, 4, 1, 5, 9, 2], [3, 1, 4, 1, 6, 6]):  # the last one rejects 5, 9, 2
        proposal = drafter.propose([DraftRequest(slot=0, token_ids=list(tokens))], 3, batch_params(1, 0.7))
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
        pard_drafter(target, broken_copy(checkpoint, tmp_path, **change))
    assert message in str(err.value) and str(tmp_path) in str(err.value), str(err.value)
