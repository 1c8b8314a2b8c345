"""Familiar names: vLLM's speculative_config onto the method group; model paths by HF repo id from the local cache."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec_cli.config.aliases import expand_aliases
from specdec_cli.config.hub import cached_snapshot, hub_cache_dir
from specdec_cli.config.validate import resolve
from specdec_cli.errors import ConfigError


def alias(spec: dict) -> str:
    return "++speculative_config=" + json.dumps(spec)


@pytest.mark.parametrize(("spec", "name", "fields"), [
    ({"method": "eagle3", "model": "ckpt/eagle", "num_speculative_tokens": 4}, "eagle3",
     {"checkpoint": "ckpt/eagle", "num_draft_tokens": 4}),
    ({"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 3, "prompt_lookup_max": 5}, "ngram",
     {"num_draft_tokens": 6, "min_n": 3, "max_n": 5}),
    ({"method": "deepseek_mtp", "num_speculative_tokens": 2}, "mtp", {"num_draft_tokens": 2}),
    ({"method": "mtp", "num_speculative_tokens": 1}, "mtp", {"num_draft_tokens": 1}),
    ({"method": "draft_model", "model": "it's/a draft", "num_speculative_tokens": 3}, "draft_target",
     {"draft_path": "it's/a draft", "num_draft_tokens": 3}),
    ({"model": "small/lm"}, "draft_target", {"draft_path": "small/lm"}),  # vLLM: a model and no method
    ({"method": "suffix"}, "suffix", {}),
])
def test_speculative_config_maps_onto_the_method_group(make_config, spec, name, fields) -> None:
    method = make_config(alias(spec)).method
    assert method.name == name
    for field, value in fields.items():
        assert getattr(method, field) == value


def test_later_overrides_win_and_hydra_dict_syntax_is_accepted(make_config) -> None:
    cfg = make_config("speculative_config={method: ngram, num_speculative_tokens: 6}", "method.num_draft_tokens=2")
    assert (cfg.method.name, cfg.method.num_draft_tokens) == ("ngram", 2)


def test_other_overrides_pass_through_unchanged() -> None:
    overrides = ["method=eagle3", "hydra.run.dir=out/x", "-m", "+speculative=1"]
    assert expand_aliases(overrides) == overrides


@pytest.mark.parametrize(("value", "message"), [
    ({"method": "eagle3", "draft_tensor_parallel_size": 1, "foo": 2},
     "unknown key(s) draft_tensor_parallel_size, foo"),
    ({"method": "medusa"}, "Medusa heads are not supported"),
    ({"method": "lookahead"}, "method='lookahead': unknown method"),
    ({"num_speculative_tokens": 4}, 'give "method"'),
    ({"method": "ngram", "model": "x"}, "method=ngram takes no draft model"),
    ({"method": "eagle3", "prompt_lookup_max": 3}, "prompt_lookup_max applies to method=ngram only"),
    ({"method": "ngram", "num_speculative_tokens": "4"}, "num_speculative_tokens='4' must be an integer"),
    ([1, 2], "is not a JSON object"),
])
def test_bad_speculative_config_names_the_problem(make_config, value, message) -> None:
    with pytest.raises(ConfigError) as info:
        make_config(alias(value))
    assert any(message in line for line in info.value.violations), info.value.violations


# --------------------------------------------------------------------------- Hugging Face cache
def fake_snapshot(cache: Path, repo_id: str, revision: str, *, ref: bool = True) -> Path:
    """The hub cache layout: models--owner--name/{refs/main, snapshots/<revision>/config.json}."""
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    if ref:
        (repo_dir / "refs").mkdir(exist_ok=True)
        (repo_dir / "refs" / "main").write_text(revision)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # a repo id is also a relative path: none exists here
    return cache


def test_cache_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache_dir() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert hub_cache_dir() == tmp_path / "cache"


def test_snapshot_is_the_one_refs_main_names(hub_cache: Path) -> None:
    old = fake_snapshot(hub_cache, "Org/Model", "aaa111")
    fake_snapshot(hub_cache, "Org/Model", "bbb222", ref=False)
    assert cached_snapshot("Org/Model") == old
    (hub_cache / "models--Org--Model" / "refs" / "main").unlink()  # no ref: the newest snapshot
    assert cached_snapshot("Org/Model").name in {"aaa111", "bbb222"}
    assert cached_snapshot("Org/Other") is None


def test_repo_ids_resolve_to_cached_snapshots(make_config, hub_cache: Path) -> None:
    target = fake_snapshot(hub_cache, "HuggingFaceTB/SmolLM2-135M-Instruct", "0123abcd")
    head = fake_snapshot(hub_cache, "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "feedbeef")
    cfg = make_config("model=hf", "model.path=HuggingFaceTB/SmolLM2-135M-Instruct", "method=eagle3",
                      "method.checkpoint=yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    assert (cfg.model.path, cfg.method.checkpoint) == (str(target), str(head))


def test_hf_home_is_honoured(make_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.chdir(tmp_path)
    snapshot = fake_snapshot(tmp_path / "hf_home" / "hub", "Org/Tiny", "c0ffee")
    assert make_config("model=hf", "model.path=Org/Tiny").model.path == str(snapshot)


def test_a_repo_missing_from_the_cache_is_a_config_error(make_config, hub_cache: Path) -> None:
    cfg = make_config("model=hf", "model.path=Org/Missing", "method=pard", "method.checkpoint=Org/NoDraft")
    with pytest.raises(ConfigError) as info:
        resolve(cfg)
    text = "\n".join(info.value.violations)
    assert "model.path=Org/Missing does not exist, and Org/Missing is not in the local Hugging Face cache" in text
    assert "method.checkpoint=Org/NoDraft does not exist" in text and "never downloads" in text


def test_local_paths_win_over_repo_ids(make_config, hub_cache: Path, tmp_path: Path) -> None:
    fake_snapshot(hub_cache, "Org/Local", "1234")
    (tmp_path / "Org" / "Local").mkdir(parents=True)  # the relative path exists: it is used as given
    assert make_config("model=hf", "model.path=Org/Local").model.path == "Org/Local"
