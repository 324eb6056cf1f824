"""The captioning run the captioning tests share (trained once per session, one thread)."""

import pytest
import torch
from caption_support import train_tiny


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train_tiny(tmp_path_factory.mktemp("cap") / "run", eval_every=150)
    finally:
        torch.set_num_threads(old)
