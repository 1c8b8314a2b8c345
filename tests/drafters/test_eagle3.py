"""EAGLE-3: the published checkpoint layout, the drafting chain (== its training unroll), rewinds,
and lossless speculative decoding through the engine on the toy target."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from learned_helpers import (
    TOY_LAYERS,
    VOCAB,
    assert_follows_law,
    generate,
    make_engine,
    toy_checkpoint,
    toy_target,
    trained_toy_checkpoint,
)
from safetensors.torch import load_file, save_file

from specdec_cli.config.schema import Eagle3MethodConfig, NoneMethodConfig
from specdec_cli.drafters import build_drafter, learned
from specdec_cli.drafters.base import DrafterDeps, DraftRequest
from specdec_cli.drafters.eagle3 import load_eagle3
from specdec_cli.drafters.learned import FeatureDrafter
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.errors import ConfigError
from specdec_cli.models.rope import RotaryTables
from specdec_cli.testing import exact_sequence_law, toy_model
from specdec_cli.train.unroll import unroll_head

CONTEXT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]
PUBLISHED = {"fc.weight", "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
             "midlayer.post_attention_layernorm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
             *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
             *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down"))}


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Toy-sized ops: one thread is faster than two (and far faster on a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target():
    return toy_target()


@pytest.fixture(scope="module")
def checkpoint(target, tmp_path_factory) -> Path:
    return Path(toy_checkpoint("eagle3", target, tmp_path_factory.mktemp("eagle3")))


@pytest.fixture(scope="module")
def trained(target, tmp_path_factory) -> str:
    return trained_toy_checkpoint("eagle3", target, tmp_path_factory.mktemp("trained"))


def request(tokens: list[int], temperature: float = 1.0, seed: int = 0, **hidden) -> DraftRequest:
    return DraftRequest(slot=0, token_ids=list(tokens), temperature=temperature, top_k=0, top_p=1.0,
                        generator=torch.Generator().manual_seed(seed), **hidden)


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


def test_no_shipped_head_is_one_clear_config_error(target, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(learned, "ASSETS", tmp_path)
    deps = DrafterDeps(target=target, num_slots=1, max_seq_len=32, vocab_size=VOCAB, device=torch.device("cpu"),
                       dtype=torch.float32)
    with pytest.raises(ConfigError) as info:
        build_drafter(Eagle3MethodConfig(), deps)
    (line,) = info.value.violations
    assert "no shipped draft exists yet" in line and "specdec train method=eagle3" in line
    assert "method.checkpoint=" in line


# ---------------------------------------------------------------- drafting
def test_training_unroll_matches_the_drafting_chain(target, checkpoint: Path) -> None:
    """Training-time test attention sees exactly what the drafting chain has in its cache."""
    head = load_eagle3(checkpoint, target)
    proposal = drafter_for(head, target).propose([request(CONTEXT)], k=3)
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
    first = drafter.propose([request(CONTEXT)], k=3).tokens[0].tolist()
    committed = CONTEXT + [first[0], (first[1] + 1) % VOCAB]  # d1 accepted, d2 rejected and replaced
    cache = target.new_cache(1, 32)
    with torch.inference_mode():
        out = target(cache, [0], torch.tensor(committed[:-1]), hidden_layers=TOY_LAYERS)
    new_hidden = {layer: h[-2:] for layer, h in out.hidden.items()}  # the 2 positions verified this step
    resumed = drafter.propose([request(committed, seed=5, target_hidden=new_hidden)], k=3)
    fresh = drafter_for(load_eagle3(checkpoint, target), target).propose([request(committed, seed=5)], k=3)
    assert torch.equal(resumed.tokens, fresh.tokens)
    assert torch.allclose(resumed.draft_probs, fresh.draft_probs, atol=1e-6)


# ---------------------------------------------------------------- through the engine
PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 6, 7], [9, 9, 9, 9, 9, 9, 3], [4, 3, 2, 1, 0, 4, 3, 2, 1, 0, 4, 3]]


@pytest.mark.parametrize("policy", ["sample", "argmax"])
def test_greedy_speculative_equals_autoregressive(target, trained: str, policy: str) -> None:
    greedy = [SamplingParams(temperature=0.0)] * len(PROMPTS)
    baseline = generate(make_engine(target, NoneMethodConfig(), batch=2), PROMPTS, greedy, 30)
    engine = make_engine(target, Eagle3MethodConfig(checkpoint=trained, num_draft_tokens=3, draft_policy=policy),
                         batch=3)
    assert generate(engine, PROMPTS, greedy, 30) == baseline
    assert engine.stats.accepted_drafts > 0 and engine.stats.guard_fallbacks == 0 and engine.drafter.recomputed == 0


def test_draft_length_toggling_to_zero_keeps_the_head_in_sync(target, trained: str) -> None:
    """K = 3 alone, 0 while 3+ requests run (features of skipped steps pile up), then 3 again."""
    engine = make_engine(target, Eagle3MethodConfig(checkpoint=trained, num_draft_tokens=3), batch=4, schedule={2: 3})
    lengths = [40, 8, 10, 12]
    requests = [Request(id=str(i), prompt_token_ids=p, params=SamplingParams(), max_new_tokens=n)
                for i, (p, n) in enumerate(zip(PROMPTS, lengths))]
    engine.add_request(requests[0])
    for _ in range(4):
        engine.step()
    alone = engine.stats.proposed_drafts
    for request in requests[1:]:
        engine.add_request(request)
    while engine.has_work():
        engine.step()
    assert alone > 0 and engine.stats.proposed_drafts > alone
    assert engine.drafter.recomputed == 0  # every catch-up found exactly the features it needed
    baseline = make_engine(target, NoneMethodConfig(), batch=1)
    for request in requests:
        assert generate(baseline, [request.prompt_token_ids], [SamplingParams()], request.max_new_tokens)[0] == \
            request.output_token_ids


@pytest.mark.parametrize("sampler", [dict(temperature=1.0), dict(temperature=1.0, top_k=4),
                                     dict(temperature=0.8, top_p=0.7)])
def test_sampled_output_follows_the_target_law(target, trained: str, sampler: dict) -> None:
    prompt, num = [3, 1, 4, 1, 5], 3000
    law = exact_sequence_law(target, prompt, 3, **sampler)
    engine = make_engine(target, Eagle3MethodConfig(checkpoint=trained, num_draft_tokens=2), batch=64)
    samples = torch.tensor(generate(engine, [prompt] * num, [SamplingParams(seed=i, **sampler) for i in range(num)], 3))
    assert 0 < engine.stats.accepted_drafts < engine.stats.proposed_drafts
    assert engine.stats.guard_fallbacks == 0
    assert_follows_law(samples, law)
