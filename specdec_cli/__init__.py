"""specdec: speculative decoding with distribution-preserving rejection sampling."""
import os as _os

# torch's OpenMP threads spin while idle by default; on a busy machine (2 cores shared with
# other work) that makes small operators 10-100x slower. Passive waiting costs little when
# the machine is idle. Must be set before torch is imported; users can override it.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    """``from specdec_cli import LLM, SamplingParams``: the API loads (with torch) on first use only."""
    if name in __all__:
        from specdec_cli import api

        return getattr(api, name)
    raise AttributeError(f"module 'specdec_cli' has no attribute {name!r}")
