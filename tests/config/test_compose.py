"""Every option of every config group composes into the typed schema; typos are errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from specdec_cli.config.compose import CONF_DIR, compose_config
from specdec_cli.config.methods import method_schemas
from specdec_cli.config.schema import HfModelConfig, RunConfig
from specdec_cli.errors import ConfigError

EXPECTED_OPTIONS = {
    "method": set(method_schemas()),
    "sampler": {"greedy", "temperature", "topk", "topp", "topk_topp"},
    "rejection": {"auto", "on", "off"},
    "parallelism": {"single", "tp2", "adp2", "cp2"},
    "model": {"smollm2_135m", "hf"},
    "workload": {"quick", "mt_bench", "repetitive", "jsonl", "mixed", "showcase", "spec_bench"},
}
ALL_OPTIONS = [(group, option) for group, options in EXPECTED_OPTIONS.items() for option in sorted(options)]


def test_conf_holds_exactly_the_expected_options() -> None:
    found = {group: {p.stem for p in (CONF_DIR / group).glob("*.yaml")} for group in EXPECTED_OPTIONS}
    assert found == EXPECTED_OPTIONS
    assert sum(len(list((CONF_DIR / group).glob("*.yaml"))) for group in EXPECTED_OPTIONS) == 29
    assert {p.name for p in CONF_DIR.glob("*.yaml")} == {"config.yaml", "train.yaml"}


@pytest.mark.parametrize(("group", "option"), ALL_OPTIONS)
def test_every_option_composes_into_its_schema(group: str, option: str) -> None:
    cfg = compose_config([f"{group}={option}"])
    assert isinstance(cfg, RunConfig)
    node = getattr(cfg, group)
    if group == "method":
        assert type(node) is method_schemas()[option]
    label = node.mode if group == "rejection" else node.name
    assert label == option
    first_line = (CONF_DIR / group / f"{option}.yaml").read_text().split("defaults:")[1]
    assert first_line.lstrip().startswith("- base_")


def test_defaults() -> None:
    cfg = compose_config([])
    assert (cfg.method.name, cfg.sampler.name, cfg.rejection.mode) == ("eagle3", "greedy", "auto")
    assert (cfg.parallelism.name, cfg.model.name, cfg.workload.name) == ("single", "smollm2_135m", "showcase")
    assert cfg.model.path is None and cfg.workload.source == "inline" and len(cfg.workload.prompts) == 6
    assert not cfg.baseline and cfg.method.draft_len_schedule == {}  # make run adds baseline=true


def test_sampler_presets() -> None:
    presets = {
        "greedy": (0.0, 0, 1.0),
        "temperature": (1.0, 0, 1.0),
        "topk": (1.0, 20, 1.0),
        "topp": (1.0, 0, 0.9),
        "topk_topp": (1.0, 50, 0.9),
    }
    for name, expected in presets.items():
        sampler = compose_config([f"sampler={name}"]).sampler
        assert (sampler.temperature, sampler.top_k, sampler.top_p) == expected


def test_model_hf_is_its_own_schema() -> None:
    assert isinstance(compose_config(["model=hf"]).model, HfModelConfig)


def test_values_are_typed() -> None:
    cfg = compose_config(["method=eagle3", "method.num_draft_tokens=6", "method.target_layers=[1,5]"])
    assert cfg.method.num_draft_tokens == 6 and cfg.method.target_layers == [1, 5]


def test_dict_field_is_set_with_double_plus() -> None:
    cfg = compose_config(["++method.draft_len_schedule={1:4,8:2}"])
    assert cfg.method.draft_len_schedule == {1: 4, 8: 2}
    with pytest.raises(ConfigError, match=r"\+\+method.draft_len_schedule="):
        compose_config(["method.draft_len_schedule={1:4,8:2}"])


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ("method.foo=1", "Key 'foo' not in 'Eagle3MethodConfig'"),
        ("+method.foo=1", "method.foo is not a field of Eagle3MethodConfig"),
        ("+foo=1", "foo is not a field of RunConfig"),
        ("method=eagle3 method.min_n=3", "Key 'min_n' not in 'Eagle3MethodConfig'"),
        ("method.num_draft_tokens=abc", "could not be converted to Integer"),
        ("sampler.temperature=hot", "could not be converted to Float"),
        ("method=foo", "method=foo: no such option (choose one of: dflash, draft_target"),
        ("method=eagle3 method.target_layers=[1,2", "cannot parse override"),
        ("~method", "method is required"),
    ],
)
def test_typos_and_wrong_types_are_one_line_errors(overrides: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        compose_config(overrides.split())
    (line,) = info.value.violations
    assert expected in line and "\n" not in line


def test_config_dir_is_the_repository_conf() -> None:
    assert CONF_DIR == Path(__file__).resolve().parents[2] / "conf"
