"""Shared fixtures of the attention-core tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: extra intra-op threads only add contention on a shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
