"""qkv.training.lock: a run folder's lock is taken over only from a process that no longer runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from qkv._fs import process_state
from qkv.training.lock import LOCK, acquire, read_lock, release
from qkv.training.rundir import RunError


def _lock_of(folder, pid: int) -> None:
    (folder / LOCK).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": "then"}))


def test_a_live_holder_is_named_and_a_dead_one_taken_over(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _lock_of(tmp_path, live.pid)
        with pytest.raises(RunError, match=f"in use by process {live.pid} .*delete .*{LOCK}"):
            acquire(tmp_path)
    finally:
        live.kill()
        live.wait()
    acquire(tmp_path)  # the holder is gone (reaped): its lock is stale
    assert read_lock(tmp_path)["pid"] == os.getpid()
    release(tmp_path)
    assert read_lock(tmp_path) is None


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_killed_holder_nobody_reaped_does_not_hold_the_folder(tmp_path):
    # a rank killed under a container's first process that reaps nothing stays a zombie for good
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _lock_of(tmp_path, child.pid)
        child.send_signal(9)
        deadline = time.time() + 30
        while process_state(child.pid) != "Z":
            assert time.time() < deadline
            time.sleep(0.01)
        acquire(tmp_path)
        assert read_lock(tmp_path)["pid"] == os.getpid()
    finally:
        child.wait()
    release(tmp_path)
