"""Fixtures of the drafter tests (the toys themselves are in ``toys.py``)."""
from __future__ import annotations

import pytest
import torch

from toys import toy_target


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Toy-sized ops: one thread is faster than two (and far faster on a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target():
    """The 2-layer toy target (vocabulary 16)."""
    return toy_target()
