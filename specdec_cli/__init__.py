"""specdec: speculative decoding with distribution-preserving rejection sampling."""
# OpenMP's wait policy is left to libgomp (spin briefly, then sleep). Forcing OMP_WAIT_POLICY=PASSIVE
# (this package's default until stop 26) made every parallel region pay a futex wake-up: a 135M decode took
# 53 ms instead of 31 ms on 2 cores. Set it to PASSIVE yourself only when several multi-threaded processes
# share the cores (two concurrent processes: 50 ms each passive vs 75 ms with libgomp's default).

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    """``from specdec_cli import LLM, SamplingParams``: the API loads (with torch) on first use only."""
    if name in __all__:
        from specdec_cli import api

        return getattr(api, name)
    raise AttributeError(f"module 'specdec_cli' has no attribute {name!r}")
