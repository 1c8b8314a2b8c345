"""Fixtures of the parallel tests: toy checkpoints on disk, single-process references, and the
PYTHONPATH that lets spawned ranks import ``rank_jobs``."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest
from toy_run import Methods, Paths, Reference, method_overrides, outputs, run_config, write_toy_tree

from specdec_cli.run.job import run_job

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def toy_paths(tmp_path_factory: pytest.TempPathFactory) -> Paths:
    return write_toy_tree(tmp_path_factory.mktemp("toy"))


@pytest.fixture(scope="session")
def methods(toy_paths: Paths) -> Methods:
    return method_overrides(toy_paths)


@pytest.fixture(scope="session")
def reference(toy_paths: Paths, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """``reference(*overrides)`` -> the single-process outputs.jsonl rows of that run (memoised)."""
    cache: dict[tuple[str, ...], list[dict]] = {}

    def run(*overrides: str) -> list[dict]:
        if overrides not in cache:
            cfg, effective = run_config(toy_paths, *overrides)
            output_dir = tmp_path_factory.mktemp("single")
            with pytest.MonkeyPatch.context() as patch:
                # run_job uses every core; on a shared 2-core machine two OpenMP threads per toy
                # forward spin on each other (50x slower), and one thread gives the same tokens
                patch.setattr(os, "cpu_count", lambda: 1)
                run_job(cfg, effective, output_dir, show_progress=False)
            cache[overrides] = outputs(output_dir)
        return cache[overrides]

    return run


@pytest.fixture(scope="session", autouse=True)
def ranks_import_test_helpers() -> Iterator[None]:
    """Spawned ranks inherit the environment: let them import this directory's modules."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), saved]))
    yield
    if saved is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved
