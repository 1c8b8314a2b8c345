"""The support matrix and the validator for parallelism (what ``specdec check`` prints)."""
from __future__ import annotations

import pytest
from toy_run import CPU

from specdec_cli.config.compose import compose_config
from specdec_cli.config.matrix import MATRIX, METHODS
from specdec_cli.config.validate import resolve
from specdec_cli.errors import ConfigError
from specdec_cli.parallel.shard import SHARD_DRAFT_MIN_PARAMS


def supported_by(feature: str) -> set[str]:
    return {method for method, cell in MATRIX[feature].items() if cell.supported}


def violations(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as error:
        resolve(compose_config(list(overrides)), CPU)
    return error.value.violations


def test_tp_and_adp_are_supported_for_every_method_and_cp_for_none() -> None:
    assert supported_by("tensor_parallel") == set(METHODS)
    assert supported_by("attention_dp") == set(METHODS)
    assert supported_by("context_parallel") == set()
    assert "never gathered" in MATRIX["tensor_parallel"]["eagle3"].reason
    draft_target = MATRIX["tensor_parallel"]["draft_target"].reason
    assert "(max, argmax)" in draft_target and f"under {SHARD_DRAFT_MIN_PARAMS // 10**9}B parameters" in draft_target


@pytest.mark.parametrize("option", ["tp2", "adp2"])
def test_parallel_runs_validate(option: str) -> None:
    effective = resolve(compose_config(["method=draft_target", "sampler=temperature", "rejection=on",
                                        f"parallelism={option}"]), CPU)
    assert effective.rejection


def test_refused_combinations() -> None:
    (line,) = violations("parallelism.tp=2", "parallelism.dp=2")
    assert "cannot be combined" in line
    (line,) = violations("method=eagle3", "parallelism=cp2", "rejection=off")
    assert "context parallelism" in line and "whole-vocabulary target rows" in line
