"""File-system safety in one place: atomic writes, checksums, temp names and their cleanup.

Every file or folder qkv writes goes through a temporary name beside its destination and a rename
(``os.replace``), so a reader sees the old content or the new, never half. Temp names carry the
writer's process id and host::

    .NAME.tmp-PID-HOST-RANDOM

so that the next run can tell leftovers of a killed process (same host, process gone) from work in
progress, and remove them (:func:`clean_stale_temps`).

Whole folders are replaced by :func:`replace_dir`: the new folder is assembled aside, then swapped
with the old one in one ``renameat2(RENAME_EXCHANGE)`` where the kernel offers it (else two
renames, with the old folder kept aside until the new one is in place).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import shutil
import socket
import uuid
from pathlib import Path

__all__ = ["atomic_write_text", "atomic_write_bytes", "sha256_file", "temp_path", "make_temp_dir",
           "make_temp_file", "clean_stale_temps", "pid_alive", "replace_dir", "check_output_path"]

_TMP = ".tmp-"


def _host() -> str:
    return socket.gethostname().replace("-", "_")


def temp_path(dest: str | os.PathLike, tag: str = "tmp") -> Path:
    """A fresh temp path beside ``dest``: ``.NAME.<tag>-PID-HOST-RANDOM`` (not created)."""
    dest = Path(dest)
    return dest.parent / f".{dest.name}.{tag}-{os.getpid()}-{_host()}-{uuid.uuid4().hex[:8]}"


def make_temp_dir(dest: str | os.PathLike) -> Path:
    """Create and return an empty temp folder beside ``dest`` (stale ones of ``dest`` removed first)."""
    clean_stale_temps(dest)
    tmp = temp_path(dest)
    tmp.mkdir()
    return tmp


def make_temp_file(dest: str | os.PathLike) -> tuple[int, Path]:
    """Create a temp file beside ``dest``; returns ``(fd, path)`` (stale ones of ``dest`` removed first)."""
    clean_stale_temps(dest)
    tmp = temp_path(dest)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    return fd, tmp


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_temps(dest: str | os.PathLike) -> list[Path]:
    """Remove temp files/folders of ``dest`` left by dead processes of this host; return them."""
    dest = Path(dest)
    removed = []
    if not dest.parent.is_dir():
        return removed
    prefix = f".{dest.name}."
    for p in dest.parent.glob(f".{_glob_escape(dest.name)}.*-*-*-*"):
        rest = p.name[len(prefix):]
        tag, _, tail = rest.partition("-")
        parts = tail.split("-")
        if len(parts) != 3 or not parts[0].isdigit() or parts[1] != _host() or not tag.isidentifier():
            continue
        if pid_alive(int(parts[0])):
            continue
        if tag == "old" and not dest.exists():  # killed between the two renames of replace_dir
            os.replace(p, dest)
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder, fsync, and a rename."""
    path = Path(path)
    fd, tmp = make_temp_file(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256_file(path: str | os.PathLike) -> str:
    """sha256 hex digest of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with ``renameat2(RENAME_EXCHANGE)``; False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    AT_FDCWD = -100
    rc = fn(AT_FDCWD, os.fsencode(str(a)), AT_FDCWD, os.fsencode(str(b)), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(tmp: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Put the finished folder ``tmp`` at ``dest``, replacing a folder there as a whole.

    A reader (or a crash at any moment) sees the old folder or the new one at ``dest``; on the
    fallback path (no ``renameat2``) a crash between the two renames leaves the old folder at
    ``.DEST.old-PID-HOST-…`` beside it, removed by the next call.
    """
    tmp, dest = Path(tmp), Path(dest)
    clean_stale_temps(dest)
    if not dest.exists():
        os.replace(tmp, dest)
    elif _exchange(tmp, dest):
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old folder
    else:
        old = temp_path(dest, "old")
        os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(dest.parent)


def check_output_path(path: str | os.PathLike, what: str = "--out") -> None:
    """Fail early, before any computation, when ``path`` cannot be created or replaced.

    Raises:
        QkvError: an ancestor is a file, the nearest existing folder is not writable, or ``path``
            itself is a folder where a file is expected.
    """
    from qkv.errors import QkvError

    path = Path(path)
    if path.is_dir():
        raise QkvError(f"{what} {path} is a folder; give a file name")
    probe = path.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise QkvError(f"{what} {path}: {probe} is a file, not a folder; choose another {what}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise QkvError(f"{what} {path}: {probe} is not writable; choose another {what}")
