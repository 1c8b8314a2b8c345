"""``specdec train``: a real Hydra application that self-distils a drafter for a target.

The config root is ``conf/train.yaml``: the same ``method`` and ``model`` groups as ``specdec run`` plus
the training fields, flat: ``TrainConfig``'s and every method's own (``config/train_root.py``); the job
gets the chosen method's train schema. Its run directory defaults to
``outputs/train/<model>/<method>``, so rerunning a command resumes it. Errors are printed as in
``specdec run``: one ``error:`` line per problem, exit 2 for configuration/input problems.
"""
from __future__ import annotations

from pathlib import Path

import hydra
import typer
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.table import Table
from rich.text import Text

from specdec_cli.cli.completion import script_request
from specdec_cli.cli.output import console
from specdec_cli.cli.run import JobFailed, _hydra_process, guarded_job
from specdec_cli.config.compose import _unknown_keys, conf_dir
from specdec_cli.config.schema import TrainConfig
from specdec_cli.config.store import register_train_configs
from specdec_cli.config.train_root import narrow
from specdec_cli.errors import ConfigError


def train(ctx: typer.Context) -> None:
    """Train a drafter (eagle3 | mtp | draft_target | pard | dflash) by self-distillation. Arguments go to Hydra.

    \b
    specdec train method=eagle3              (the embedded SmolLM2; rerun to resume)
    specdec train method=mtp steps=2000 out_dir=runs/mtp
    specdec train method=draft_target draft_layers=4
    specdec train method=pard pard_layers=4  (then specdec run method=pard method.checkpoint=<run dir>/pard)
    specdec train method=dflash dflash_layers=2
    specdec train --cfg job                  (print the composed config)
    """
    if (script := script_request(ctx.args)) is not None:  # -sc install=bash: the one specdec script
        print(script)
        return
    from specdec_cli.train.methods import train_schemas  # torch loads only for `specdec train`

    register_train_configs(train_schemas())
    failures: list[int] = []

    def job(config: DictConfig) -> dict | None:
        return guarded_job(_execute, config, failures)

    app = hydra.main(config_path=str(conf_dir()), config_name="train", version_base="1.3")
    with _hydra_process(["specdec train", *ctx.args]):
        app(job)()
    if failures:
        raise JobFailed(failures[0])


def to_train_config(config: DictConfig) -> TrainConfig:
    """The chosen method's typed train schema; missing values, unknown keys, fields of other methods and
    violated rules are errors, all at once."""
    from specdec_cli.train.methods import train_schemas
    from specdec_cli.train.pipeline import check_train_config

    problems = [f"{key} is required: set {key}=..." for key in sorted(OmegaConf.missing_keys(config))]
    problems += _unknown_keys(config, "")
    if problems:
        raise ConfigError(problems)
    flat = OmegaConf.to_object(config)
    assert isinstance(flat, TrainConfig)
    cfg, problems = narrow(flat, train_schemas())
    problems += check_train_config(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def _execute(config: DictConfig) -> dict:
    from specdec_cli.train.pipeline import run_training  # torch and models load only for real runs

    cfg = to_train_config(config)
    out_dir = Path(cfg.out_dir or HydraConfig.get().runtime.output_dir)
    summary = run_training(cfg, out_dir, console=console)
    table = Table(title="training summary", show_header=False, title_justify="left")
    rows = {"method": cfg.method.name, "steps": str(summary["steps"]),
            "speed": f"{summary['tokens_per_s']:.0f} trained tokens/s ({summary['wall_s']:.0f} s)",
            "drafter": summary["artifact"]}
    if summary["eval"]:
        stats = summary["eval"]
        held_out = f"top-1 {stats['top1']:.3f}, greedy acceptance length {stats['acceptance_length']:.3f}"
        if "sampled_acceptance_length" in stats:
            held_out += f", T=1 {stats['sampled_acceptance_length']:.3f}"
        rows["held-out"] = f"{held_out} (K={cfg.method.num_draft_tokens})"
    for key, value in rows.items():
        table.add_row(key, Text(value))
    console.print(table)
    return summary
