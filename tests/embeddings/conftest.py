"""Fixtures of the embedding tests (the model folders they share with other folders are in tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """These tests run many tiny forward passes; on a shared 2-core machine two OpenMP threads spend
    more time waiting for each other than computing (≈ 7× slower per small batch). Restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
