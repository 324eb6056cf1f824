"""The benchmark scripts set torch's thread count (``--threads``, or the machine's cores): every test
here gets the count it started with back afterwards."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
