"""MTP: DeepSeek-V3-style checkpoint names, the shared target head (full or d2t rows) and the drafting
chain (== its training unroll); the contract is in test_drafter_contract.py, decoding through the engine in
test_drafters_in_engine.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from specdec_cli.drafters.base import DraftRequest
from specdec_cli.drafters.feature_head import FeatureDrafter
from specdec_cli.drafters.mtp import load_mtp
from specdec_cli.errors import ConfigError
from specdec_cli.models.rope import RotaryTables
from specdec_cli.train.unroll import unroll_head
from toys import CONTEXT, DRAFT_IDS, batch_params, toy_checkpoint

MODULE = {"enorm.weight", "hnorm.weight", "eh_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
          "shared_head.norm.weight", *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
          *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down"))}


@pytest.fixture(scope="module")
def checkpoint(target, tmp_path_factory) -> Path:
    """A reduced-vocabulary module (d2t rows of the shared head)."""
    return Path(toy_checkpoint("mtp", target, tmp_path_factory.mktemp("mtp")))


def test_checkpoint_uses_deepseek_names_and_round_trips(target, checkpoint: Path) -> None:
    stored = load_file(checkpoint / "model.safetensors")
    assert set(stored) == {f"model.layers.2.{name}" for name in MODULE} | {"d2t"}  # the layer after the target's 2
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1 and config["num_hidden_layers"] == 2
    head = load_mtp(checkpoint, target)
    assert head.needs_final_hidden and head.hidden_layers == () and head.draft_vocab_size == len(DRAFT_IDS)
    assert torch.equal(head.lm_weight, target.lm_head.weight[DRAFT_IDS])  # rows of the shared head, not stored
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, stored["d2t" if name == "d2t" else f"model.layers.2.{name}"]), name


def test_full_vocabulary_module_shares_the_target_head(target, tmp_path: Path) -> None:
    head = load_mtp(toy_checkpoint("mtp", target, tmp_path, reduced=False), target)
    assert head.d2t is None and head.lm_weight.data_ptr() == target.lm_head.weight.data_ptr()


@pytest.mark.parametrize("corruption,expected", [
    ("drop", r"tensor 'eh_proj\.weight' missing"),
    ("reshape", r"model\.safetensors: tensor 'model\.layers\.2\.enorm\.weight' has shape \(3,\), expected \(32,\)"),
    ("config", r"config\.json: missing field 'num_hidden_layers'"),
])
def test_malformed_checkpoints_are_named(target, checkpoint: Path, tmp_path: Path, corruption: str,
                                         expected: str) -> None:
    tensors = load_file(checkpoint / "model.safetensors")
    config = json.loads((checkpoint / "config.json").read_text())
    if corruption == "drop":
        del tensors["model.layers.2.eh_proj.weight"]
    elif corruption == "reshape":
        tensors["model.layers.2.enorm.weight"] = torch.ones(3)
    else:
        del config["num_hidden_layers"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=expected) as info:
        load_mtp(tmp_path, target)
    assert str(tmp_path) in str(info.value)


def test_an_eagle3_head_is_not_an_mtp_module(target, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"an EAGLE-3 head, not an MTP module \(use method=eagle3\)"):
        load_mtp(toy_checkpoint("eagle3", target, tmp_path), target)


def test_training_unroll_matches_the_drafting_chain(target, checkpoint: Path) -> None:
    """Step 1 reads the target's post-norm hidden, later steps the module's own shared_head.norm output."""
    head = load_mtp(checkpoint, target)
    drafter = FeatureDrafter(head, target, num_slots=1, max_seq_len=64, policy="sample")
    drafter.add_request(0, CONTEXT)
    proposal = drafter.propose([DraftRequest(slot=0, token_ids=list(CONTEXT))], 3, batch_params(1))
    sequence = torch.tensor(CONTEXT + proposal.tokens[0].tolist())
    with torch.inference_mode():
        final = target(target.new_cache(1, 32), [0], sequence[: len(CONTEXT) - 1], final_hidden=True).final_hidden
        outs = unroll_head(head, RotaryTables(head.arch, dtype=torch.float32, device="cpu"), final[None],
                           sequence[None], steps=3)
    for step, step_out in enumerate(outs):
        expected = F.softmax(head.logits(step_out[0, len(CONTEXT) - 2]), -1)
        assert torch.allclose(proposal.draft_probs[0, step], expected, atol=1e-5), step
    assert set(proposal.tokens[0].tolist()) <= set(DRAFT_IDS.tolist())  # target ids of the draft vocabulary
