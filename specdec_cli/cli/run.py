"""``specdec run``: a real Hydra application (``-m`` sweeps, ``hydra.*`` overrides, ``--cfg``).

Typer hands its raw arguments to ``@hydra.main``. Each Hydra job types its config,
validates it, then writes ``effective.json`` (``dry_run=true``), skips a finished job
(``skip_if_done=true``) or runs the job (``run.job.run_job``). A failing job prints its own ``error:``
lines, so a sweep reports every failure:
- single run: the job returns and the process exits with the job's code (2: config/input);
- sweep (``-m``): the job raises, Hydra still runs the remaining jobs, writes one
  ``Error executing job with overrides: [...]`` line, and the process exits with the
  first failed job's code.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Callable, Iterator

import hydra
import typer
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from specdec_cli.cli.completion import script_request
from specdec_cli.cli.output import (
    console,
    debug_enabled,
    error_lines,
    print_effective,
    print_errors,
    print_run_summary,
)
from specdec_cli.config.aliases import expand_aliases
from specdec_cli.config.compose import conf_dir, refuse_repeated_groups, to_run_config
from specdec_cli.config.store import register_configs
from specdec_cli.config.validate import resolve
from specdec_cli.engine.workload import read_workload
from specdec_cli.errors import SpecdecError
from specdec_cli.files import atomic_write_json

CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}  # all to Hydra
METAVAR = "[OVERRIDES AND HYDRA FLAGS]"


class JobFailed(SpecdecError):
    """A Hydra job failed and already printed why; carries the process exit code."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(f"job failed with exit code {exit_code}")
        self.exit_code = exit_code


def run(ctx: typer.Context) -> None:
    """Run one job, or a sweep with -m. Arguments go to Hydra unchanged.

    \b
    specdec run method=eagle3 sampler=topk
    specdec run -m method=none,ngram sampler=greedy,temperature
    specdec run method=pard dry_run=true hydra.run.dir=out/pard
    specdec run --cfg job          (print the composed config)
    specdec run --hydra-help       (Hydra's own flags)
    specdec run -m hydra/sweeper=optuna objective=tokens_per_s 'method.num_draft_tokens=int(interval(1,8))'
    eval "$(specdec run -sc install=bash)"   (shell completion)
    """
    if (script := script_request(ctx.args)) is not None:
        print(script)
        return
    register_configs()
    failures: list[int] = []  # exit codes of failed single-run jobs

    def job(config: DictConfig) -> dict | float | None:
        return guarded_job(_execute, config, failures)

    app = hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")
    with _hydra_process(["specdec run", *expand_aliases(ctx.args)]):
        app(job)()
    if failures:
        raise JobFailed(failures[0])


@contextlib.contextmanager
def _hydra_process(argv: list[str]) -> Iterator[None]:
    """Hydra reads sys.argv; HYDRA_FULL_ERROR lets its errors reach the error boundary."""
    refuse_repeated_groups(argv[1:])
    saved_argv, saved_env = sys.argv, os.environ.get("HYDRA_FULL_ERROR")
    sys.argv, os.environ["HYDRA_FULL_ERROR"] = argv, "1"
    try:
        yield
    finally:
        sys.argv = saved_argv
        if saved_env is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved_env
        GlobalHydra.instance().clear()


def guarded_job(execute: Callable[[DictConfig], dict | float | None], config: DictConfig,
                failures: list[int]) -> dict | float | None:
    """Run one Hydra job (``run`` or ``train``); its errors are printed here (see the module docstring)."""
    try:
        return execute(config)
    except Exception as err:
        if debug_enabled():
            raise
        lines, code = error_lines(err)
        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode != RunMode.MULTIRUN:
            print_errors(lines)
            failures.append(code)
            return None
        overrides = " ".join(hydra_cfg.overrides.task)
        print_errors(lines, prefix=f"job {hydra_cfg.job.num} ({overrides}): ")
        raise JobFailed(code) from err


def _execute(config: DictConfig) -> dict | float | None:
    """One job; returns the results.json record, or with ``objective=<metric>`` that metric (for Optuna)."""
    cfg = to_run_config(config)
    effective = resolve(cfg)
    read_workload(cfg.workload)  # every row checked in milliseconds, before any model loads (dry runs too)
    output_dir = Path(cfg.output_dir or HydraConfig.get().runtime.output_dir)
    if cfg.dry_run:
        record = {"config": dataclasses.asdict(cfg), "effective": effective.to_dict()}
        atomic_write_json(output_dir / "effective.json", record)
        print_effective(cfg, effective)
        return None
    if cfg.skip_if_done and (output_dir / "results.json").exists():
        console.print(f"skipped: {output_dir / 'results.json'} exists", markup=False)
        return objective_value(json.loads((output_dir / "results.json").read_text()), cfg.objective) if cfg.objective else None
    from specdec_cli.run.job import run_job  # torch and models load only for real runs

    result = run_job(cfg, effective, output_dir)
    print_run_summary(result, str(output_dir))
    return objective_value(result.to_dict(), cfg.objective)


def objective_value(record: dict, objective: str | None) -> dict | float:
    """What a job returns: the results.json ``record``, or its ``metrics[objective]`` as a float."""
    return record if objective is None else float(record["metrics"][objective])
