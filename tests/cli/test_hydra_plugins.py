"""Hydra's ecosystem through ``specdec run``: the joblib launcher, the Optuna sweeper maximising ``objective``,
the submitit launcher's configs, and bash completion of commands and overrides (as bash calls it)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specdec_cli.cli.completion import BASH_SCRIPT, COMPLETE_ENV

def test_joblib_launcher_runs_a_sweep_in_worker_processes(specdec, tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    result = specdec("run", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "method=none,ngram",
                     "dry_run=true", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=${method.name}")
    assert result.exit_code == 0, result.err
    for name in ("none", "ngram"):
        assert json.loads((tmp_path / name / "effective.json").read_text())["config"]["method"]["name"] == name


def test_objective_must_be_a_metric(specdec, tmp_path: Path) -> None:
    result = specdec("run", "objective=speed", "dry_run=true", f"hydra.run.dir={tmp_path}")
    assert result.exit_code == 2
    assert "objective=speed is not one of: tokens_per_s, acceptance_length" in result.err


def test_optuna_maximises_the_objective_a_job_returns(specdec, tmp_path: Path) -> None:
    """Each trial's job returns metrics[objective] as a float; finished jobs (skip_if_done) return theirs too,
    so this sweep needs no model: results.json is written beforehand for every K."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    tokens_per_s = {1: 10.0, 2: 30.0, 3: 20.0}
    for k, value in tokens_per_s.items():
        (tmp_path / f"k{k}").mkdir()
        (tmp_path / f"k{k}" / "results.json").write_text(json.dumps({"metrics": {"tokens_per_s": value}}))
    result = specdec("run", "-m", "hydra/sweeper=optuna", "hydra.sweeper.direction=maximize",
                     "hydra.sweeper.n_trials=6", "hydra.sweeper.sampler.seed=0", "method=ngram",
                     "method.num_draft_tokens=choice(1,2,3)", "objective=tokens_per_s", "skip_if_done=true",
                     f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=k${method.num_draft_tokens}")
    assert result.exit_code == 0, result.err
    best = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert best["best_params"] == {"method.num_draft_tokens": 2}
    assert best["best_value"] == 30.0


@pytest.mark.parametrize(("tune", "params"), [
    ("eagle3", {"method.num_draft_tokens", "method.draft_confidence"}),
    ("eagle3_tree", {"method.num_draft_tokens", "method.tree_topk", "method.max_total_draft_tokens",
                     "method.draft_confidence"}),
])
def test_tuning_recipes_set_up_an_optuna_study_of_valid_jobs(specdec, tmp_path: Path, tune: str,
                                                             params: set[str]) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    shown = specdec("run", f"+tune={tune}", "--cfg", "hydra", "--package", "hydra.sweeper")
    assert shown.exit_code == 0, shown.err
    sweeper = yaml.safe_load(shown.out)
    assert sweeper["direction"] == "maximize" and set(sweeper["params"]) == params
    result = specdec("run", f"+tune={tune}", "dry_run=true", f"hydra.run.dir={tmp_path}")
    assert result.exit_code == 0, result.err
    config = json.loads((tmp_path / "effective.json").read_text())["config"]
    assert (config["objective"], config["method"]["name"]) == ("tokens_per_s", "eagle3")


@pytest.mark.parametrize(("launcher", "target"), [
    ("submitit_slurm", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"),
    ("submitit_local", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"),
])
def test_submitit_launcher_configs_compose(specdec, launcher: str, target: str) -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    result = specdec("run", "--cfg", "hydra", "--package", "hydra.launcher", f"hydra/launcher={launcher}",
                     "hydra.launcher.timeout_min=30", "hydra.launcher.gpus_per_node=1")
    assert result.exit_code == 0, result.err
    config = yaml.safe_load(result.out)  # the hydra.launcher node
    assert (config["_target_"], config["timeout_min"], config["gpus_per_node"]) == (target, 30, 1)


# --------------------------------------------------------------------------- shell completion
def completions(specdec, monkeypatch: pytest.MonkeyPatch, line: str) -> list[str]:
    monkeypatch.setenv(COMPLETE_ENV, "bash")
    monkeypatch.setenv("COMP_LINE", line)
    monkeypatch.setenv("COMP_POINT", str(len(line)))
    result = specdec()
    assert result.exit_code == 0, result.err
    return result.out.split()


def test_install_prints_the_specdec_script(specdec) -> None:
    for command in ("run", "train"):
        result = specdec(command, "-sc", "install=bash")
        assert result.exit_code == 0 and result.out.strip() == BASH_SCRIPT
    assert "complete -o nospace -o default -F _specdec_completion specdec" in BASH_SCRIPT


@pytest.mark.parametrize(("line", "expected", "absent"), [
    ("specdec ", {"run", "train", "check", "report", "verify", "--debug"}, set()),
    ("specdec run meth", {"method=", "method."}, set()),
    ("specdec run method=ea", {"method=eagle3"}, {"method=base_eagle3"}),
    ("specdec run method=eagle3 method.num", {"method.num_draft_tokens="}, set()),
    ("specdec --debug run sampler=", {"sampler=greedy", "sampler=topk"}, {"sampler=base_sampler"}),
    ("specdec run hydra/launcher=", {"hydra/launcher=joblib", "hydra/launcher=submitit_slurm"}, set()),
    ("specdec train method=", {"method=eagle3", "method=pard"}, {"method=base_pard"}),
    ("specdec check --", {"--markdown", "--help"}, set()),
])
def test_completion_candidates(specdec, monkeypatch: pytest.MonkeyPatch, line: str, expected: set[str],
                               absent: set[str]) -> None:
    found = set(completions(specdec, monkeypatch, line))
    assert expected <= found and not absent & found, found


def test_bash_completes_through_the_installed_function(tmp_path: Path) -> None:
    """bash evaluates the script, then calls the function with COMP_LINE / COMP_POINT / COMP_WORDS set."""
    bash, specdec_bin = shutil.which("bash"), Path(sys.executable).parent / "specdec"
    if bash is None or not specdec_bin.exists():
        pytest.skip("needs bash and the installed specdec entry point")
    probe = """eval "$(specdec run -sc install=bash)"
COMP_LINE='specdec run method=eag'; COMP_POINT=${#COMP_LINE}; COMP_WORDS=(specdec run method=eag); COMP_CWORD=2
_specdec_completion; printf '%s\\n' "${COMPREPLY[@]}"
"""
    env = {**os.environ, "PATH": f"{specdec_bin.parent}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run([bash, "-c", probe], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["method=eagle3"]
