"""Recipes (``conf/recipe/``) expand into the documented sweeps; finished sweep jobs are skipped."""
from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from report.report_trees import results_record
from specdec_cli.config.compose import conf_dir
from specdec_cli.run.result import RunResult

SPECDEC = Path(sys.executable).parent / "specdec"
QUIET = ("hydra/job_logging=disabled", "hydra/hydra_logging=disabled")
SELF4 = "draft_target(self=4)"
# recipe -> the (method, sampler, K, temperature) set its sweep must produce
RECIPES = {
    "compare_methods": {
        (m, s, 0 if m == "none" else 4, 0.0 if s == "greedy" else 1.0)
        for m in ("none", "ngram", "suffix", SELF4) for s in ("greedy", "temperature", "topk", "topp")
    },
    "draft_length": {(m, "temperature", k, 1.0) for m in ("ngram", SELF4) for k in (1, 2, 4, 6, 8)},
    "sampling_sensitivity": {
        (m, "temperature", 0 if m == "none" else 4, t)
        for m in ("none", "ngram", SELF4) for t in (0.0, 0.3, 0.7, 1.0, 1.3)
    },
}


def test_every_recipe_file_is_covered() -> None:
    assert {p.stem for p in (conf_dir() / "recipe").glob("*.yaml")} == set(RECIPES)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_recipe_expands_into_its_sweep(recipe: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(SPECDEC), "run", "-m", f"+recipe={recipe}", "dry_run=true", f"hydra.sweep.dir={tmp_path}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    jobs = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(jobs) == len(RECIPES[recipe])
    seen = set()
    for job in jobs:
        config = json.loads((job / "effective.json").read_text())["config"]
        method = config["method"]
        label = SELF4 if method.get("self_speculative_layers") == 4 else method["name"]
        assert config["workload"]["name"] == "mt_bench"
        seen.add((label, config["sampler"]["name"], method["num_draft_tokens"], config["sampler"]["temperature"]))
    assert seen == RECIPES[recipe]


def test_rerun_with_skip_if_done_skips_finished_jobs(run_specdec, monkeypatch, tmp_path: Path) -> None:
    calls: list[Path] = []
    fake = types.ModuleType("specdec_cli.run.job")
    fake.run_job = lambda cfg, effective, output_dir: (  # type: ignore[attr-defined]
        calls.append(output_dir) or RunResult(cfg, effective, results_record(cfg.method.name, "greedy")["metrics"], [])
    )
    monkeypatch.setitem(sys.modules, "specdec_cli.run.job", fake)
    sweep = ("-m", "method=none,ngram", f"hydra.sweep.dir={tmp_path}", *QUIET)
    assert run_specdec("run", *sweep, "dry_run=true")[0] == 0
    finished = tmp_path / "0" / "results.json"
    finished.write_text('{"marker": 1}')
    code, out, err = run_specdec("run", *sweep, "skip_if_done=true")
    assert code == 0, err
    assert f"skipped: {finished} exists" in out.replace("\n", "")
    assert finished.read_text() == '{"marker": 1}'
    assert calls == [tmp_path / "1"]  # the unfinished job ran
