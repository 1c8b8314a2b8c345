"""Errors raised by the model runtime; each message names what to fix (file, tensor, slot, length)."""
from __future__ import annotations

from specdec_cli.errors import SpecdecError


class ModelError(SpecdecError):
    """Base class of every error raised by ``specdec_cli.models``."""


class ModelLoadError(ModelError):
    """A checkpoint could not be loaded: missing file, bad tensor shape, unsupported architecture or
    quantization. A bad checkpoint is bad input: exit 2, like a bad draft checkpoint."""

    exit_code = 2


class CacheOverflowError(ModelError):
    """A forward would write past a slot's ``max_len``."""
