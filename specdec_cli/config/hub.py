"""Model paths by Hugging Face repo id, from the local cache only (never a download).

``model.path=HuggingFaceTB/SmolLM2-135M-Instruct`` names
``$HF_HUB_CACHE/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/<revision>`` when no such local path
exists; the cache is ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub`` (huggingface_hub's order). The revision is the one ``refs/main`` names, else
the newest snapshot. ``resolve_model_paths`` rewrites a config's paths; a repo id that is not cached stays
as given, and ``config/fields.py`` reports it.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from specdec_cli.config.schema import RunConfig

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name
METHOD_PATH_FIELDS = ("checkpoint", "draft_path")


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache, from the environment as huggingface_hub reads it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "huggingface" / "hub"


def cached_snapshot(repo_id: str, cache: Optional[Path] = None) -> Optional[Path]:
    """The local snapshot directory of model repo ``repo_id`` (``refs/main``, else the newest), or None."""
    repo_dir = (cache or hub_cache_dir()) / f"models--{repo_id.replace('/', '--')}"
    ref = repo_dir / "refs" / "main"
    if ref.is_file() and (repo_dir / "snapshots" / ref.read_text().strip()).is_dir():
        return repo_dir / "snapshots" / ref.read_text().strip()
    snapshots = [p for p in (repo_dir / "snapshots").glob("*") if p.is_dir()]
    return max(snapshots, key=lambda p: p.stat().st_mtime) if snapshots else None


def is_repo_id(value: str) -> bool:
    """Whether ``value`` reads as a Hugging Face repo id (``owner/name``) rather than a local path."""
    return bool(REPO_ID.match(value)) and not Path(value).expanduser().exists()


def local_path(value: Optional[str]) -> Optional[str]:
    """``value``, or the cached snapshot when it is a repo id that is not a local path."""
    if value is None or not is_repo_id(value):
        return value
    snapshot = cached_snapshot(value)
    return str(snapshot) if snapshot is not None else value


def not_cached(key: str, value: str) -> str:
    """The message for a repo id that is neither a local path nor in the local cache."""
    return (f"{key}={value} does not exist, and {value} is not in the local Hugging Face cache "
            f"({hub_cache_dir()}); specdec never downloads: fetch it first (huggingface-cli download {value})")


def resolve_model_paths(cfg: RunConfig) -> None:
    """Replace ``model.path`` and the method's checkpoint / draft path by their cached snapshots (in place)."""
    cfg.model.path = local_path(cfg.model.path)
    for field in METHOD_PATH_FIELDS:
        if hasattr(cfg.method, field):
            setattr(cfg.method, field, local_path(getattr(cfg.method, field)))
