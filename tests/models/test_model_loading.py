"""load_model on HF directories (single file, sharded) and its error messages for broken ones."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from model_factories import tiny_hf
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from specdec_cli.models import ModelArch, ModelLoadError, UnsupportedArchitectureError, load_model
from specdec_cli.models.loading import cache_root, draft_tokenizer_problem, tokenizers_match

CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"


def _save_tokenizer(directory: Path) -> None:
    vocab = {f"w{i}": i for i in range(128)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0", chat_template=CHAT_TEMPLATE).save_pretrained(
        directory
    )


def _save(hf: PreTrainedModel, directory: Path, **kwargs: object) -> Path:
    hf.save_pretrained(directory, **kwargs)
    _save_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def hf_model() -> PreTrainedModel:
    return tiny_hf("qwen2", tie=False, seed=5)


@pytest.mark.parametrize("shard", [None, "40KB"])
@torch.inference_mode()
def test_round_trip_through_a_hf_directory(hf_model: PreTrainedModel, tmp_path: Path, shard: str | None) -> None:
    directory = _save(hf_model, tmp_path / "m", **({"max_shard_size": shard} if shard else {}))
    assert (directory / "model.safetensors.index.json").is_file() == (shard is not None)
    model, tokenizer = load_model(str(directory))
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert not any(p.requires_grad for p in model.parameters())
    ids = torch.randint(0, 128, (16,))
    ref = hf_model(ids[None]).logits[0]
    torch.testing.assert_close(model(model.new_cache(1, 16), [0], ids).logits, ref, rtol=0, atol=1e-4)


@torch.inference_mode()
def test_bfloat16_load(hf_model: PreTrainedModel, tmp_path: Path) -> None:
    model, _ = load_model(_save(hf_model, tmp_path / "m"), dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16 and model.new_cache(1, 8).k.dtype == torch.bfloat16
    ids = torch.randint(0, 128, (8,))
    logits = model(model.new_cache(1, 8), [0], ids).logits
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, hf_model(ids[None]).logits[0], rtol=0, atol=0.15)


def test_missing_path_and_missing_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found or not a model"):
        load_model(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="config.json: missing"):
        load_model(str(tmp_path / "empty"))


def test_missing_shard_is_named(hf_model: PreTrainedModel, tmp_path: Path) -> None:
    directory = _save(hf_model, tmp_path / "m", max_shard_size="40KB")
    weight_map = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    shard = sorted(set(weight_map.values()))[-1]
    (directory / shard).unlink()
    with pytest.raises(ModelLoadError, match=f"{shard}: listed in model.safetensors.index.json but missing"):
        load_model(str(directory))


def test_wrong_shape_names_file_and_tensor(hf_model: PreTrainedModel, tmp_path: Path) -> None:
    directory = _save(hf_model, tmp_path / "m")
    tensors = load_file(directory / "model.safetensors")
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(3, 64)
    save_file(tensors, directory / "model.safetensors")
    message = r"model.safetensors: tensor model.layers.1.mlp.up_proj.weight has shape \(3, 64\)"
    with pytest.raises(ModelLoadError, match=message):
        load_model(str(directory))


def test_missing_tensor_is_named(hf_model: PreTrainedModel, tmp_path: Path) -> None:
    directory = _save(hf_model, tmp_path / "m")
    tensors = load_file(directory / "model.safetensors")
    del tensors["lm_head.weight"]  # untied model: the head is required
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(ModelLoadError, match="tensors missing from the checkpoint: lm_head.weight"):
        load_model(str(directory))


def test_unsupported_model_type_names_the_config(hf_model: PreTrainedModel, tmp_path: Path) -> None:
    directory = _save(hf_model, tmp_path / "m")
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "gpt2"
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="config.json: model_type='gpt2' is not supported"):
        load_model(str(directory))


def test_missing_tokenizer(hf_model: PreTrainedModel, tmp_path: Path) -> None:
    hf_model.save_pretrained(tmp_path / "m")
    with pytest.raises(ModelLoadError, match="no tokenizer files"):
        load_model(str(tmp_path / "m"))


def test_cache_root_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("SPECDEC_CACHE")
    assert cache_root() == Path.home() / ".cache" / "specdec"


@pytest.mark.parametrize("quantization", [
    {"quant_method": "fp8", "activation_scheme": "dynamic"},
    {"quant_method": "awq", "bits": 4, "group_size": 128},
    {"quant_method": "gptq", "bits": 4},
    {"quant_method": "bitsandbytes", "load_in_4bit": True},
])
def test_quantized_checkpoints_are_refused(hf_model: PreTrainedModel, tmp_path: Path, quantization: dict) -> None:
    directory = _save(hf_model, tmp_path / "m")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "quantization_config": quantization}))
    with pytest.raises(ModelLoadError, match=f"quantized checkpoint .*quant_method='{quantization['quant_method']}'") \
            as err:
        load_model(str(directory))
    assert err.value.exit_code == 2


@pytest.mark.parametrize("edit", ["scale_tensor", "float8_weight"])
def test_quantized_tensors_without_a_config_are_refused(hf_model: PreTrainedModel, tmp_path: Path, edit: str) -> None:
    directory = _save(hf_model, tmp_path / "m")
    tensors = load_file(directory / "model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    if edit == "scale_tensor":
        tensors[name.replace(".weight", ".weight_scale")] = torch.ones(1)
    else:
        tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(ModelLoadError, match="quantized checkpoint"):
        load_model(str(directory))


def test_a_text_file_named_gguf_exits_2(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_text("not a model\n")
    with pytest.raises(ModelLoadError, match="model.gguf: cannot read GGUF metadata") as err:
        load_model(str(fake), cache_dir=tmp_path / "cache")
    assert err.value.exit_code == 2


@pytest.mark.parametrize("edit", [{"model_type": "gpt2"}, {"architectures": ["LlamaForSequenceClassification"]},
                                  {"hidden_size": "wide"}])
def test_unsupported_or_broken_configs_exit_2(hf_model: PreTrainedModel, tmp_path: Path, edit: dict) -> None:
    directory = _save(hf_model, tmp_path / "m")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **edit}))
    with pytest.raises(ModelLoadError, match="config.json: ") as err:
        load_model(str(directory))
    assert err.value.exit_code == 2


def _word_tokenizer(words: list[str], eos: str) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=words[0], eos_token=eos)


def test_tokenizers_match() -> None:
    words = [f"w{i}" for i in range(1000)]
    target = _word_tokenizer(words, eos="w1")
    assert tokenizers_match(target, _word_tokenizer(words, eos="w2")) is None  # base vs instruct: other eos
    shuffled = words[:500] + [words[501], words[500]] + words[502:]
    assert re.search(r"token id 50[01] is 'w50[01]' for the draft and 'w50[01]' for the target",
                     tokenizers_match(target, _word_tokenizer(shuffled, eos="w1")))
    renamed = [f"v{i}" for i in range(1000)]
    assert tokenizers_match(target, _word_tokenizer(renamed, eos="v1")).startswith(
        "the draft's tokenizer is not the target's: token id 0")


def test_position_limit_follows_rope_scaling(hf_model: PreTrainedModel) -> None:
    arch = ModelArch.from_hf_config(hf_model.config)
    assert arch.position_limit == arch.max_position_embeddings
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert replace(arch, rope_scaling=yarn).position_limit == 131072
    assert replace(arch, rope_scaling={"rope_type": "dynamic", "factor": 2.0}).position_limit is None


def test_draft_tokenizer_problem_reads_the_drafts_directory(tmp_path: Path) -> None:
    words = [f"w{i}" for i in range(128)]
    target = _word_tokenizer(words, eos="w1")
    (tmp_path / "none").mkdir()
    assert draft_tokenizer_problem(target, tmp_path / "none") is None  # uses the target's tokenizer
    _save_tokenizer(tmp_path / "same")  # the w0..w127 word-level tokenizer
    assert draft_tokenizer_problem(target, tmp_path / "same") is None
    _word_tokenizer([f"v{i}" for i in range(128)], eos="v1").save_pretrained(tmp_path / "other")
    assert "token id 0 is 'v0' for the draft and 'w0' for the target" in draft_tokenizer_problem(
        target, tmp_path / "other")
