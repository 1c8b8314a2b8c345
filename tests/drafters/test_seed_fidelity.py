"""Loaders refuse what they would silently get wrong: several MTP layers collapsed onto one set of names,
PARD draft ids with trained rows dropped to fit the target's vocabulary, a non-integer EAGLE-3
draft_vocab_size (a ConfigError, exit 2, not a traceback)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec_cli.config.schema import PardMethodConfig
from specdec_cli.drafters.eagle3 import load_eagle3
from specdec_cli.drafters.mtp import load_mtp
from specdec_cli.drafters.pard import PardDrafter, load_pard, save_pard, trimmed_rows_problem
from specdec_cli.errors import ConfigError
from specdec_cli.testing import toy_model
from toys import MASK, VOCAB, build, toy_checkpoint


def _edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize("value", ["abc", 0, 1.5, True, VOCAB + 1])
def test_eagle3_bad_draft_vocab_size_is_a_config_error(target, tmp_path: Path, value) -> None:
    toy_checkpoint("eagle3", target, tmp_path)
    _edit_config(tmp_path, draft_vocab_size=value)
    with pytest.raises(ConfigError, match=rf"config\.json: draft_vocab_size={value!r} must be an integer in \[1, 16\]"):
        load_eagle3(tmp_path, target)


def test_a_multi_layer_mtp_checkpoint_is_refused(target, tmp_path: Path) -> None:
    toy_checkpoint("mtp", target, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    second = {name.replace("model.layers.2.", "model.layers.3."): t.clone()
              for name, t in tensors.items() if name.startswith("model.layers.2.")}
    save_file({**tensors, **second}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"2 MTP layers .*tensors under layers \[2, 3\].* exactly one MTP module"):
        load_mtp(tmp_path, target)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    _edit_config(tmp_path, num_nextn_predict_layers=2)
    with pytest.raises(ConfigError, match=r"num_nextn_predict_layers=2"):
        load_mtp(tmp_path, target)


def _wide_pard(directory: Path, *, zero_extra_rows: bool) -> str:
    """A PARD draft with 4 more ids than the target's vocabulary."""
    draft = toy_model(3, vocab_size=VOCAB + 4, num_layers=1)
    if zero_extra_rows:
        with torch.no_grad():
            draft.lm_head.weight[VOCAB:] = 0
    save_pard(draft, directory, mask_token_id=MASK)
    return str(directory)


def test_pard_trims_only_padding_rows(target, tmp_path: Path) -> None:
    trained = _wide_pard(tmp_path / "trained", zero_extra_rows=False)
    with pytest.raises(ConfigError, match=r"ids 16\.\.19 have trained LM-head rows and are not known padding"):
        build(target, PardMethodConfig(checkpoint=trained), 2)
    padded = _wide_pard(tmp_path / "padded", zero_extra_rows=True)
    build(target, PardMethodConfig(checkpoint=padded), 2)  # accepted
    model, _ = load_pard(padded)
    assert trimmed_rows_problem(model, VOCAB) is None
    assert PardDrafter(model, MASK, vocab_size=VOCAB, num_slots=1, max_seq_len=8, policy="sample").draft_vocab_size == VOCAB


class Tokenizer:
    def __len__(self) -> int:
        return VOCAB


def test_pard_ids_the_tokenizer_never_produces_are_padding(tmp_path: Path) -> None:
    model, _ = load_pard(_wide_pard(tmp_path, zero_extra_rows=False))
    assert trimmed_rows_problem(model, VOCAB) is not None
    assert trimmed_rows_problem(model, VOCAB, Tokenizer()) is None
