"""Shipping a trained draft: float16, target-shared tensors dropped and refilled at load time, the size
limit, the manifest, and the only-replace-on-improvement rule."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdec_cli.config.schema import DraftTargetMethodConfig
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.models import ModelLoadError
from specdec_cli.models.loading import SHARED_WITH_TARGET, load_hf_dir
from specdec_cli.testing import toy_model
from specdec_cli.train import ship as ship_module
from specdec_cli.train.heads import new_draft_model, save_draft_model


@pytest.fixture()
def trained_run(tmp_path: Path):
    """A toy target and a run directory as `specdec train method=draft_target` leaves it."""
    target = toy_model(0, vocab_size=16, num_layers=2)
    draft = new_draft_model(target, 1)
    with torch.no_grad():
        draft.layers[0].mlp.down_proj.weight.mul_(1.5)  # make it differ from the target's layer
    run = tmp_path / "run"
    save_draft_model(draft, run / "draft_target")
    (run / "train.json").write_text(json.dumps({"steps": 7, "wall_s": 1.0, "trained_tokens": 50,
                                                "eval": {"acceptance_length": 1.5}}))
    return target, draft, run


def test_shipped_draft_target_shares_the_embedding_and_loads_back(trained_run, tmp_path: Path) -> None:
    target, draft, run = trained_run
    dest = ship_module.ship("draft_target", run, "specdec train method=draft_target", {"x": 1}, dest=tmp_path / "ship",
                            target=target)
    config = json.loads((dest / "config.json").read_text())
    shared = ["model.embed_tokens.weight"] + ([] if target.arch.tie_word_embeddings else ["lm_head.weight"])
    assert config[SHARED_WITH_TARGET] == shared
    from safetensors.torch import load_file

    tensors = load_file(str(dest / "model.safetensors"))
    assert not set(shared) & set(tensors)
    assert all(t.dtype == torch.float16 for t in tensors.values())
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["steps"] == 7 and manifest["measured"] == {"x": 1} and manifest["weights"]["bytes"] > 0

    with pytest.raises(ModelLoadError, match="shared with its target|shares"):
        load_hf_dir(dest, dtype=torch.float32, device="cpu")
    loaded = load_hf_dir(dest, dtype=torch.float32, device="cpu", shared_from=target)
    assert torch.equal(loaded.embed_tokens.weight, target.embed_tokens.weight)
    assert torch.equal(loaded.lm_head.weight, target.lm_head.weight)
    torch.testing.assert_close(loaded.layers[0].mlp.down_proj.weight, draft.layers[0].mlp.down_proj.weight.half().float())

    # the drafter accepts the shipped directory as draft_path
    deps = DrafterDeps(target=target, num_slots=1, max_seq_len=32, vocab_size=16, device=torch.device("cpu"),
                       dtype=torch.float32)
    drafter = build_drafter(DraftTargetMethodConfig(draft_path=str(dest), num_draft_tokens=2, suffix_enhancer=False), deps)
    assert torch.equal(drafter.model.embed_tokens.weight, target.embed_tokens.weight)


def test_a_shared_tensor_of_the_wrong_shape_is_a_clear_error(trained_run, tmp_path: Path) -> None:
    target, _, run = trained_run
    dest = ship_module.ship("draft_target", run, "cmd", dest=tmp_path / "ship", target=target)
    other = toy_model(0, vocab_size=24, num_layers=2)
    with pytest.raises(ModelLoadError, match="embed_tokens.weight is shared with the target"):
        load_hf_dir(dest, dtype=torch.float32, device="cpu", shared_from=other)


def test_ship_only_replaces_on_improvement_and_respects_the_size_limit(trained_run, tmp_path: Path,
                                                                       monkeypatch) -> None:
    target, _, run = trained_run
    dest = tmp_path / "ship"
    ship_module.ship("draft_target", run, "cmd", dest=dest, target=target)
    with pytest.raises(SystemExit, match="does not improve"):
        ship_module.ship("draft_target", run, "cmd", dest=dest, target=target)
    ship_module.ship("draft_target", run, "cmd", dest=dest, force=True, target=target)
    monkeypatch.setattr(ship_module, "MAX_BYTES", 100)
    with pytest.raises(SystemExit, match="over the"):
        ship_module.ship("draft_target", run, "cmd", dest=tmp_path / "other", target=target)


def test_shipped_eagle3_lm_head_is_int8_rows_that_load_back_as_the_cpu_int8_head_quantises_them(tmp_path: Path) -> None:
    """An EAGLE-3 head ships its lm_head as int8 rows + a scale per row (half the bytes of float16): it loads as
    int8 * scale, and the CPU default (head_dtype=int8) re-quantises that to exactly the shipped int8 rows."""
    from safetensors.torch import load_file

    from specdec_cli.drafters.eagle3 import load_eagle3, save_eagle3
    from specdec_cli.models.quantize import quantize_linears
    from specdec_cli.train.heads import new_eagle3

    target = toy_model(0, vocab_size=16, num_layers=2)
    head = new_eagle3(target, torch.tensor([0, 2, 3, 5, 7, 8, 11, 15]), hidden_layers=(0, 1, 1))
    run = tmp_path / "run"
    save_eagle3(head, run / "eagle3")
    (run / "train.json").write_text(json.dumps({"steps": 3, "wall_s": 1.0, "trained_tokens": 9,
                                                "eval": {"acceptance_length": 1.2}}))
    dest = ship_module.ship("eagle3", run, "specdec train method=eagle3", dest=tmp_path / "ship")
    tensors = load_file(str(dest / "model.safetensors"))
    assert "lm_head.weight" not in tensors and tensors["lm_head.weight_int8"].dtype == torch.int8
    assert tensors["lm_head.weight_scale"].shape == (8,) and tensors["fc.weight"].dtype == torch.float16
    loaded = load_eagle3(dest, target)
    expected = tensors["lm_head.weight_int8"].float() * tensors["lm_head.weight_scale"][:, None]
    assert torch.equal(loaded.lm_head.weight, expected)
    bound = float(head.lm_head.weight.detach().abs().max()) / 200  # > half an int8 step (amax / 254) of every row
    torch.testing.assert_close(loaded.lm_head.weight, head.lm_head.weight, atol=bound, rtol=0)
    assert torch.equal(loaded.d2t, head.d2t) and torch.equal(loaded.t2d, head.t2d)
    quantize_linears(loaded, "cpu", "method.head_dtype=int8")
    assert torch.equal(loaded.lm_head.qweight, tensors["lm_head.weight_int8"])
    assert "int8" in json.loads((dest / "manifest.json").read_text())["weights"]["dtype"]
    from safetensors.torch import save_file

    from specdec_cli.errors import ConfigError

    save_file({k: v for k, v in tensors.items() if k != "lm_head.weight_scale"}, str(dest / "model.safetensors"))
    with pytest.raises(ConfigError, match="'lm_head.weight_int8' needs a 'lm_head.weight_scale' with one scale"):
        load_eagle3(dest, target)
