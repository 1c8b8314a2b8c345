"""Shared fixtures of the training tests (toy models)."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Toy-sized ops: one thread is faster than two (and far faster on a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
