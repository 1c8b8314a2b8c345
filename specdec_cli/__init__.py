"""specdec: speculative decoding with distribution-preserving rejection sampling."""
import os as _os

# torch's OpenMP threads spin while idle by default; on a busy machine (2 cores shared with
# other work) that makes small operators 10-100x slower. Passive waiting costs little when
# the machine is idle. Must be set before torch is imported; users can override it.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
