"""EAGLE-3: the published checkpoint layout, the drafting chain (== its training unroll), rewinds, and the
(the contract is in test_drafter_contract.py, decoding through the engine in test_drafters_in_engine.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec_cli.drafters.base import DraftRequest
from specdec_cli.drafters.eagle3 import load_eagle3, save_eagle3
from specdec_cli.drafters.feature_head import FeatureDrafter
from specdec_cli.errors import ConfigError
from specdec_cli.models.rope import RotaryTables
from specdec_cli.testing import toy_model
from specdec_cli.train.heads import deepen_eagle3
from specdec_cli.train.unroll import unroll_head
from toys import CONTEXT, TOY_LAYERS, VOCAB, batch_params, toy_checkpoint, toy_target

PUBLISHED = {"fc.weight", "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
             "midlayer.post_attention_layernorm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
             *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
             *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down"))}


@pytest.fixture(scope="module")
def checkpoint(target, tmp_path_factory) -> Path:
    return Path(toy_checkpoint("eagle3", target, tmp_path_factory.mktemp("eagle3")))


@pytest.fixture(scope="module")
def deep_checkpoint(target, checkpoint: Path, tmp_path_factory) -> Path:
    """The toy head deepened to 2 layers, its new layer perturbed away from the identity."""
    head = deepen_eagle3(load_eagle3(checkpoint, target), 2)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in head.extra_layers.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.2)
    return save_eagle3(head, tmp_path_factory.mktemp("deep"))


@pytest.fixture(params=["checkpoint", "deep_checkpoint"])
def one_and_two_layers(request) -> Path:
    return request.getfixturevalue(request.param)


def request(tokens: list[int], **hidden) -> DraftRequest:
    return DraftRequest(slot=0, token_ids=list(tokens), **hidden)


def drafter_for(head, target) -> FeatureDrafter:
    drafter = FeatureDrafter(head, target, num_slots=1, max_seq_len=64, policy="sample")
    drafter.add_request(0, CONTEXT)
    return drafter


# ---------------------------------------------------------------- checkpoint layout
def test_checkpoint_uses_the_published_layout_and_round_trips(target, checkpoint: Path) -> None:
    assert set(load_file(checkpoint / "model.safetensors")) == PUBLISHED
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 12
    assert config["eagle_aux_hidden_state_layer_ids"] == [layer + 1 for layer in TOY_LAYERS]  # vLLM's convention
    head = load_eagle3(checkpoint, target)
    assert head.hidden_layers == TOY_LAYERS and head.draft_vocab_size == 12
    stored = load_file(checkpoint / "model.safetensors")
    assert all(torch.equal(tensor, stored[name]) for name, tensor in head.state_dict().items())
    assert head.midlayer.self_attn.q_proj.weight.shape[1] == 2 * target.arch.hidden_size  # q/k/v read [emb; h]


def test_published_name_variants_and_bin_weights_load(target, checkpoint: Path, tmp_path: Path) -> None:
    tensors = load_file(checkpoint / "model.safetensors")
    renamed = {("model." + n.replace("midlayer.", "layers.0.")) if n != "lm_head.weight" else n: t
               for n, t in tensors.items()}
    config = json.loads((checkpoint / "config.json").read_text())
    del config["eagle_aux_hidden_state_layer_ids"]
    config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 2, 2]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    torch.save(renamed, tmp_path / "pytorch_model.bin")
    head, reference = load_eagle3(tmp_path, target), load_eagle3(checkpoint, target)
    assert head.hidden_layers == (0, 1, 1)
    assert all(torch.equal(t, reference.state_dict()[n]) for n, t in head.state_dict().items())


def test_deeper_heads_store_plain_layers_as_layers_i(target, deep_checkpoint: Path, tmp_path: Path) -> None:
    stored = load_file(deep_checkpoint / "model.safetensors")
    layer1 = {n.replace("midlayer.", "layers.1.") for n in PUBLISHED if n.startswith("midlayer.")} - {
        "layers.1.hidden_norm.weight"}
    assert set(stored) == PUBLISHED | layer1
    assert json.loads((deep_checkpoint / "config.json").read_text())["num_hidden_layers"] == 2
    head = load_eagle3(deep_checkpoint, target)
    assert head.num_layers == 2 and len(head.extra_layers) == 1
    assert stored["layers.1.self_attn.q_proj.weight"].shape[1] == target.arch.hidden_size  # a plain layer reads H
    assert all(torch.equal(tensor, stored[name.replace("extra_layers.0.", "layers.1.")])
               for name, tensor in head.state_dict().items())
    config = json.loads((deep_checkpoint / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 0}))
    (tmp_path / "model.safetensors").write_bytes((deep_checkpoint / "model.safetensors").read_bytes())
    with pytest.raises(ConfigError, match=r"config\.json: num_hidden_layers=0 must be an integer in 1\.\.8"):
        load_eagle3(tmp_path, target)


def test_deepening_a_head_keeps_its_drafts(target, checkpoint: Path) -> None:
    """``deepen_eagle3``'s new layers start as the identity: the deeper head drafts what the checkpoint drafts."""
    head = load_eagle3(checkpoint, target)
    deep = deepen_eagle3(head, 3)
    assert deep.num_layers == 3 and deep.extra_layers[1].self_attn.q_proj.weight.abs().sum() > 0
    shallow_out = drafter_for(head, target).propose([request(CONTEXT)], 3, batch_params(1, seeds=[4]))
    deep_out = drafter_for(deep, target).propose([request(CONTEXT)], 3, batch_params(1, seeds=[4]))
    assert torch.equal(shallow_out.tokens, deep_out.tokens)
    assert torch.allclose(shallow_out.draft_probs, deep_out.draft_probs, atol=1e-6)


def test_default_layers_are_eagle3s_low_mid_high(checkpoint: Path, tmp_path: Path) -> None:
    """No layer ids in the checkpoint: outputs of layers (1, N/2-1, N-4) = HF hidden_states[2, N/2, N-3]."""
    deep = toy_model(0, vocab_size=VOCAB, num_layers=8)
    config = json.loads((checkpoint / "config.json").read_text())
    del config["eagle_aux_hidden_state_layer_ids"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((checkpoint / "model.safetensors").read_bytes())
    assert load_eagle3(tmp_path, deep).hidden_layers == (1, 3, 4)
    assert load_eagle3(tmp_path, deep, target_layers=[0, 2, 6]).hidden_layers == (0, 2, 6)


def _corrupt(checkpoint: Path, directory: Path, *, drop=None, reshape=None, config_drop=None, d2t=None) -> None:
    tensors = load_file(checkpoint / "model.safetensors")
    config = json.loads((checkpoint / "config.json").read_text())
    if drop:
        del tensors[drop]
    if reshape:
        tensors[reshape] = torch.zeros(3, 3)
    if d2t is not None:
        tensors["d2t"] = d2t
    if config_drop:
        del config[config_drop]
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("corruption,expected", [
    (dict(drop="fc.weight"), r"tensor 'fc\.weight' missing"),
    (dict(reshape="lm_head.weight"),
     r"model\.safetensors: tensor 'lm_head\.weight' has shape \(3, 3\), expected \(12, 32\)"),
    (dict(config_drop="hidden_size"), r"config\.json: missing field 'hidden_size'"),
    (dict(d2t=torch.zeros(12, dtype=torch.int64).index_fill_(0, torch.tensor([11]), 9)), r"tensor 'd2t' must map"),
])
def test_malformed_checkpoints_are_named(target, checkpoint: Path, tmp_path: Path, corruption, expected) -> None:
    _corrupt(checkpoint, tmp_path, **corruption)
    with pytest.raises(ConfigError, match=expected) as info:
        load_eagle3(tmp_path, target)
    assert str(tmp_path) in str(info.value)


def test_wrong_target_and_missing_directory(checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"vocab_size=16 but the target's vocabulary has 32"):
        load_eagle3(checkpoint, toy_model(0, vocab_size=32, num_layers=2))
    with pytest.raises(ConfigError, match=r"config\.json: missing \(not a draft checkpoint"):
        load_eagle3(tmp_path / "nowhere", toy_target())
    with pytest.raises(ConfigError, match=r"an MTP module, not an EAGLE-3 head \(use method=mtp\)"):
        load_eagle3(toy_checkpoint("mtp", directory=tmp_path / "mtp"), toy_target())


# ---------------------------------------------------------------- drafting
def test_training_unroll_matches_the_drafting_chain(target, one_and_two_layers: Path) -> None:
    """Training-time test attention sees exactly what the drafting chain has in its cache (every layer)."""
    head = load_eagle3(one_and_two_layers, target)
    proposal = drafter_for(head, target).propose([request(CONTEXT)], 3, batch_params(1))
    sequence = torch.tensor(CONTEXT + proposal.tokens[0].tolist())
    cache = target.new_cache(1, 32)
    with torch.inference_mode():
        out = target(cache, [0], sequence[None, : len(CONTEXT) - 1], hidden_layers=TOY_LAYERS)
        features = torch.cat([out.hidden[layer] for layer in TOY_LAYERS], -1)[None]
        rope = RotaryTables(head.arch, dtype=torch.float32, device="cpu")
        outs = unroll_head(head, rope, features, sequence[None], steps=3)
    anchor = len(CONTEXT) - 2
    for step, step_out in enumerate(outs):
        expected = torch.softmax(head.logits(step_out[0, anchor]), -1)
        assert torch.allclose(proposal.draft_probs[0, step], expected, atol=1e-5), step


def test_rewind_replaces_own_entries_with_target_features(target, checkpoint: Path) -> None:
    """After a partial acceptance the head's cache equals a fresh one built from target features."""
    head = load_eagle3(checkpoint, target)
    drafter = drafter_for(head, target)
    first = drafter.propose([request(CONTEXT)], 3, batch_params(1)).tokens[0].tolist()
    committed = CONTEXT + [first[0], (first[1] + 1) % VOCAB]  # d1 accepted, d2 rejected and replaced
    cache = target.new_cache(1, 32)
    with torch.inference_mode():
        out = target(cache, [0], torch.tensor(committed[:-1]), hidden_layers=TOY_LAYERS)
    new_hidden = {layer: h[-2:] for layer, h in out.hidden.items()}  # the 2 positions verified this step
    resumed = drafter.propose([request(committed, target_hidden=new_hidden)], 3, batch_params(1, seeds=[5]))
    fresh = drafter_for(load_eagle3(checkpoint, target), target).propose([request(committed)], 3, batch_params(1, seeds=[5]))
    assert torch.equal(resumed.tokens, fresh.tokens)
    assert torch.allclose(resumed.draft_probs, fresh.draft_probs, atol=1e-6)
