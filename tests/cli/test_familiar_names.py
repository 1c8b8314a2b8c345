"""Familiar names at the command line: speculative_config and HF repo ids exit 2 with one line each when wrong."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


def alias(spec: dict) -> str:
    return "++speculative_config=" + json.dumps(spec)


def test_cli_exits_2_naming_unknown_keys(specdec, tmp_path: Path) -> None:
    result = specdec("run", alias({"method": "eagle3", "bogus_key": 1}), "dry_run=true",
                         f"hydra.run.dir={tmp_path}")
    assert result.exit_code == 2
    assert "unknown key(s) bogus_key" in result.err
    assert not (tmp_path / "effective.json").exists()


def test_cli_dry_run_records_the_mapped_method(specdec, tmp_path: Path) -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3}
    result = specdec("run", alias(spec), "dry_run=true", f"hydra.run.dir={tmp_path}")
    assert result.exit_code == 0, result.err
    method = json.loads((tmp_path / "effective.json").read_text())["config"]["method"]
    assert (method["name"], method["num_draft_tokens"], method["max_n"]) == ("ngram", 5, 3)


def test_cli_exits_2_for_an_uncached_repo(specdec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.chdir(tmp_path)
    result = specdec("run", "model=hf", "model.path=Org/Missing", "dry_run=true", f"hydra.run.dir={tmp_path / 'o'}")
    assert result.exit_code == 2
    assert "not in the local Hugging Face cache" in result.err
