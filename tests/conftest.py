"""Shared fixtures: typed configs composed from conf/ (no files written, no models loaded)."""
from __future__ import annotations

from typing import Callable

import pytest

from specdec_cli.config.compose import compose_config
from specdec_cli.config.schema import RunConfig


@pytest.fixture
def make_config() -> Callable[..., RunConfig]:
    """``make_config("method=eagle3", "sampler=topk")`` -> the composed, typed RunConfig."""
    return lambda *overrides: compose_config(list(overrides))
