"""Ablation tests train tiny models: one intra-op thread avoids oversubscription on a busy 2-core box."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
