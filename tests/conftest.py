"""Fixtures shared across the test folders."""

import pytest
import torch

# Folders whose tests run tiny models or tensors: extra intra-op threads there only add contention on
# a shared 2-core machine (and oversubscribe it when a test starts training subprocesses).
ONE_THREAD_FOLDERS = ("nn", "training", "experiments", "faults")


@pytest.fixture(autouse=True)
def _one_thread(request):
    """One torch intra-op thread for the tests in :data:`ONE_THREAD_FOLDERS`, restored afterwards."""
    if request.path.parent.name not in ONE_THREAD_FOLDERS:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
