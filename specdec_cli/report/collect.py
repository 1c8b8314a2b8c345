"""Find the runs below a run or multirun directory: finished ones and the ones that are not.

A finished run is a directory with a readable ``results.json``. A Hydra job directory (it
has ``.hydra/``) without one is listed as missing, with the overrides Hydra recorded for it
(``.hydra/overrides.yaml``), so that a failed sweep job is never dropped silently. Pure
reading: nothing is written and nothing is printed.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from specdec_cli.errors import ConfigError

RESULTS = "results.json"
HYDRA_DIR = ".hydra"


@dataclass(frozen=True)
class RunRecord:
    """One finished run: its directory (relative to the report root) and its results."""

    run: str
    results: dict[str, Any]


@dataclass(frozen=True)
class MissingRun:
    """A job directory without usable results, and why."""

    run: str
    status: str  # "failed or not run", "dry run (effective.json only)", "unreadable results.json: ..."
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class Collection:
    root: Path
    runs: tuple[RunRecord, ...]
    missing: tuple[MissingRun, ...]


def collect_runs(root: Path) -> Collection:
    """Every ``results.json`` below ``root`` and every Hydra job directory without one.

    Raises ``ConfigError`` (exit 2) when ``root`` is not a directory or holds no results.
    """
    if not root.is_dir():
        raise ConfigError([f"{root}: not a directory (pass a run or multirun directory)"])
    runs: list[RunRecord] = []
    missing: list[MissingRun] = []
    for job_dir in _candidate_dirs(root):
        rel = _relative(job_dir, root)
        results_file = job_dir / RESULTS
        if results_file.is_file():
            results, problem = _read_results(results_file)
            if results is not None:
                runs.append(RunRecord(rel, results))
                continue
            missing.append(MissingRun(rel, f"unreadable {RESULTS}: {problem}", _overrides(job_dir)))
        else:
            missing.append(MissingRun(rel, _missing_status(job_dir), _overrides(job_dir)))
    if not runs:
        raise ConfigError([_no_results_message(root, missing)])
    return Collection(root, tuple(runs), tuple(missing))


def _candidate_dirs(root: Path) -> list[Path]:
    """Directories holding a results.json or a .hydra/ folder (outside hidden folders)."""
    found = {p.parent for p in root.rglob(RESULTS)} | {p.parent for p in root.rglob(HYDRA_DIR) if p.is_dir()}
    visible = [d for d in found if not any(part.startswith(".") for part in d.relative_to(root).parts)]
    return sorted(visible, key=lambda d: natural_key(_relative(d, root)))


def natural_key(text: str) -> tuple:
    """Sort key in which digit runs compare as numbers: job 2 before job 10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _relative(path: Path, root: Path) -> str:
    rel = path.relative_to(root).as_posix()
    return rel or "."


def _read_results(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(results, "") or (None, why it cannot be used)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, str(err)
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        return None, "no 'metrics' object"
    if not isinstance(data.get("config"), dict):
        return None, "no 'config' object"
    return data, ""


def _missing_status(job_dir: Path) -> str:
    if (job_dir / "effective.json").is_file():
        return "dry run (effective.json only)"
    return "failed or not run (no results.json)"


def _overrides(job_dir: Path) -> tuple[str, ...]:
    """The job's command-line overrides as Hydra recorded them (empty when unknown)."""
    path = job_dir / HYDRA_DIR / "overrides.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return ()
    return tuple(str(item) for item in data) if isinstance(data, list) else ()


def _no_results_message(root: Path, missing: list[MissingRun]) -> str:
    message = f"{root}: no results.json found below this directory"
    if missing:
        first = missing[0]
        overrides = " ".join(first.overrides) or "no overrides"
        message += (
            f" ({len(missing)} job dir(s) without results, e.g. {first.run}: "
            f"{first.status}; {overrides})"
        )
    return message
