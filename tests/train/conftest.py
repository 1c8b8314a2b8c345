"""Shared fixtures of the training tests: one thread, the toy target, the resume check."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Callable

import pytest
import torch

from specdec_cli.testing import toy_model
from specdec_cli.train.trainer import Trainer


@pytest.fixture(autouse=True, scope="package")
def one_thread(request) -> None:
    """Toy-sized ops run on one thread (faster than two, far faster on a loaded machine); restored after."""
    request.addfinalizer(functools.partial(torch.set_num_threads, torch.get_num_threads()))
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target():
    """The 2-layer toy target, vocabulary 16."""
    return toy_model(0, vocab_size=16, num_layers=2)


def _losses(out_dir: Path) -> list[float]:
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [record["loss"] for record in map(json.loads, lines) if "loss" in record]


@pytest.fixture
def check_resume(tmp_path: Path) -> Callable[..., None]:
    """``check_resume(make_trainer, crash_at, saved)``: a run of ``make_trainer(out_dir)`` killed at step
    ``crash_at`` (after its step-``saved`` checkpoint), rerun, ends exactly where an uninterrupted run does."""

    def check(make_trainer: Callable[[Path], Trainer], crash_at: int, saved: int) -> None:
        crashing = make_trainer(tmp_path)
        fetch = crashing.batch

        def batch_or_crash(indices):
            if crashing.step == crash_at:
                raise KeyboardInterrupt
            return fetch(indices)

        crashing.batch = batch_or_crash
        with pytest.raises(KeyboardInterrupt):
            crashing.run()
        assert torch.load(tmp_path / "state.pt", weights_only=True)["step"] == saved
        resumed, straight = make_trainer(tmp_path), make_trainer(tmp_path / "straight")
        resumed.run()
        straight.run()
        steps = straight.options.steps
        assert resumed.step == steps and _losses(tmp_path)[-1] == pytest.approx(_losses(tmp_path / "straight")[-1],
                                                                                 rel=1e-5)
        for name, tensor in straight.task.module.state_dict().items():
            assert torch.allclose(tensor, resumed.task.module.state_dict()[name], atol=1e-6), name

    return check
