"""What this machine offers to validation: CUDA and flashinfer, probed when asked.

Nothing here runs at import: torch and flashinfer are imported inside ``probe_hardware``,
which never raises (a broken flashinfer install is reported as a reason, not a crash).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    """The facts ``resolve`` needs; tests pass their own instead of probing."""

    cuda: bool
    flashinfer_problem: str | None  # None: flashinfer is usable; else why not


@functools.cache
def probe_hardware() -> Hardware:
    """Probe this machine once per process."""
    import torch

    cuda = torch.cuda.is_available()
    return Hardware(cuda=cuda, flashinfer_problem=_flashinfer_problem(cuda))


def _flashinfer_problem(cuda: bool) -> str | None:
    if not cuda:
        return "flashinfer needs a CUDA device and none is available"
    try:
        import flashinfer  # noqa: F401  (only whether it imports matters)
    except Exception as err:  # a broken install must not crash validation
        return f"flashinfer is not importable ({type(err).__name__}: {err})"
    return None
