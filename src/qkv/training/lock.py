"""One lock per run folder: ``RUN/.lock`` names the process that trains the run.

``.lock`` holds ``{"pid", "host", "started"}`` and is created with ``O_CREAT | O_EXCL`` (a new
run's folder is born with it: :func:`write_lock` runs inside the temporary folder before the rename
that publishes the run). A second process on the same run — a second ``--resume``, or a new run
racing for the same ``--out`` — is refused with a message naming the holder. A lock whose process is
gone (same host, no such PID, e.g. after ``kill -9``) is stale and taken over; one held from another
host cannot be checked, so the message says how to remove it by hand.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from qkv._fs import pid_alive
from qkv.training.rundir import RunError

__all__ = ["LOCK", "acquire", "release", "write_lock", "read_lock"]

LOCK = ".lock"


def _record() -> bytes:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode()


def write_lock(folder: str | os.PathLike) -> Path:
    """Create ``folder/.lock`` for this process; raise ``FileExistsError`` if there is one."""
    path = Path(folder) / LOCK
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, _record())
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_lock(folder: str | os.PathLike) -> dict | None:
    """The lock record of ``folder`` (``{}`` when unreadable, e.g. torn), or ``None`` when unlocked."""
    try:
        data = json.loads((Path(folder) / LOCK).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _stale(rec: dict, path: Path) -> bool:
    if not rec:  # torn by a crash while it was written: older than a second means nobody writes it
        return time.time() - path.stat().st_mtime > 1.0
    return rec.get("host") == socket.gethostname() and not pid_alive(int(rec.get("pid", 0) or 0))


def acquire(folder: str | os.PathLike) -> Path:
    """Take the lock of run folder ``folder`` (taking over a stale one).

    Raises:
        RunError: another live process holds it (the message names it and what to do).
    """
    folder = Path(folder)
    for _ in range(5):
        try:
            return write_lock(folder)
        except FileExistsError:
            rec = read_lock(folder)
            if rec is None:
                continue  # released meanwhile
            if rec.get("pid") == os.getpid() and rec.get("host") == socket.gethostname():
                return folder / LOCK
            if not _stale(rec, folder / LOCK):
                who = f"process {rec.get('pid')} on {rec.get('host')}" if rec else "another process"
                raise RunError(f"{folder} is in use by {who} (since {rec.get('started', '?')}); wait for "
                               f"it to finish, or if it is gone, delete {folder / LOCK}") from None
            try:
                os.unlink(folder / LOCK)
            except FileNotFoundError:
                pass
    raise RunError(f"could not take the lock {folder / LOCK}: other processes keep taking it")


def release(folder: str | os.PathLike) -> None:
    """Remove ``folder/.lock`` if this process holds it (a no-op otherwise)."""
    rec = read_lock(folder)
    if rec and rec.get("pid") == os.getpid() and rec.get("host") == socket.gethostname():
        try:
            os.unlink(Path(folder) / LOCK)
        except FileNotFoundError:
            pass
