"""Compose ``conf/`` with overrides into a typed ``RunConfig``; Hydra errors become one line.

``conf/`` lives at the repository root and is found relative to this package: specdec
runs from a checkout installed with ``pip install -e`` (``make install``), so the
config tree is never copied into the wheel. Knows nothing about validation rules.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specdec_cli.config.aliases import expand_aliases
from specdec_cli.config.hub import resolve_model_paths
from specdec_cli.config.schema import RunConfig
from specdec_cli.config.store import register_configs
from specdec_cli.errors import ConfigError, SpecdecError

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def conf_dir() -> Path:
    """The Hydra config directory, or a clear error when specdec is not run from a checkout."""
    if not (CONF_DIR / "config.yaml").is_file():
        raise SpecdecError(
            f"config directory not found at {CONF_DIR}: install specdec from a checkout "
            "with `pip install -e .` (make install)"
        )
    return CONF_DIR


def compose_config(overrides: list[str]) -> RunConfig:
    """``conf/config.yaml`` + overrides (``speculative_config`` expanded) -> ``RunConfig`` (the compose API:
    no run dir, no sweep)."""
    overrides = expand_aliases(overrides)
    refuse_repeated_groups(overrides)
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        try:
            cfg = compose(config_name="config", overrides=overrides)
        except (HydraException, OmegaConfBaseException) as err:
            raise ConfigError([describe_hydra_error(err)]) from err
    return to_run_config(cfg)


def refuse_repeated_groups(overrides: list[str]) -> None:
    """ConfigError when a config group (``method``, ``sampler``, ...) is chosen twice: Hydra would silently
    take the last. A sweep over one group (``-m method=ngram,eagle3``) is one override; fields may repeat."""
    groups = {path.name for path in conf_dir().iterdir() if path.is_dir()}
    first: dict[str, str] = {}
    problems = []
    for override in overrides:
        key, sep, _ = override.lstrip("+").partition("=")
        if not sep or key not in groups:
            continue
        if key in first:
            problems.append(f"{key} given twice ({first[key]}, {override}): choose it once "
                            f"(sweep with -m {key}=a,b)")
        first.setdefault(key, override)
    if problems:
        raise ConfigError(problems)


def to_run_config(cfg: DictConfig) -> RunConfig:
    """Convert a composed config; missing values and unknown keys are errors, all at once. Model and
    checkpoint paths given as Hugging Face repo ids become their local cache snapshots (config/hub.py)."""
    missing = [f"{key} is required: set {key}=..." for key in sorted(OmegaConf.missing_keys(cfg))]
    if missing:
        raise ConfigError(missing)
    unknown = _unknown_keys(cfg, "")
    if unknown:
        raise ConfigError(unknown)
    run_cfg = OmegaConf.to_object(cfg)
    assert isinstance(run_cfg, RunConfig)
    resolve_model_paths(run_cfg)
    return run_cfg


def _unknown_keys(node: DictConfig, prefix: str) -> list[str]:
    """Keys added with ``+key=...`` that the schema has no field for (to_object drops them)."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return []
    known = {f.name for f in dataclasses.fields(schema)}
    found = [
        f"{prefix}{key} is not a field of {schema.__name__}" for key in node if key not in known
    ]
    for key in known:
        child = node[key]
        if isinstance(child, DictConfig):
            found += _unknown_keys(child, f"{prefix}{key}.")
    return found


def describe_hydra_error(err: Exception) -> str:
    """One readable line for a Hydra/OmegaConf composition or override error."""
    if isinstance(err, MissingConfigException) and err.options is not None:
        group, _, option = (err.missing_cfg_file or "").rpartition("/")
        choices = ", ".join(o for o in err.options if not o.startswith("base_"))
        return f"{group}={option}: no such option (choose one of: {choices})"
    line = _first_line(err).rstrip(".")
    cause = err.__cause__
    if isinstance(cause, OmegaConfBaseException):
        line = f"{line}: {_first_line(cause)}"
        if getattr(cause, "object_type", None) is dict:  # new keys in a dict-valued field
            field = str(getattr(cause, "full_key", "")).rpartition(".")[0]
            line = f"{line} (set a dict-valued field with ++{field}={{...}})"
    if isinstance(err, OverrideParseException):
        line = f"cannot parse override: {line}"
    return line


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
