"""File-system safety in one place: atomic writes, checksums, temp names and their cleanup.

Every file or folder qkv writes goes through a temporary name beside its destination and a rename
(``os.replace``), so a reader sees the old content or the new, never half. Temp names carry the
writer's process id and host::

    .NAME.tmp-PID-HOST-RANDOM

so that the next run can tell leftovers of a killed process (same host, process gone) from work in
progress, and remove them (:func:`clean_stale_temps`).

Files are written through :func:`atomic_file` (a temp path to write, published when the block
ends) or :func:`atomic_write_text` / :func:`atomic_write_bytes`. Folders are assembled aside by
:func:`write_folder` and published by :func:`publish_dir`: as a whole (:func:`replace_dir`: swapped
with the old one in one ``renameat2(RENAME_EXCHANGE)`` where the kernel offers it, else two renames
with the old folder kept aside until the new one is in place), as a new folder where none (or an
empty one) was, or file by file into an existing folder whose other files are kept.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import shutil
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from qkv.validation import check_choice
from qkv.errors import QkvError
from qkv._faults import fault_point
from qkv._disk import disk_full

__all__ = ["atomic_write_text", "atomic_write_bytes", "atomic_file", "publish_file", "sha256_file",
           "temp_path", "make_temp_dir", "make_temp_file", "clean_stale_temps", "clean_stale_temps_in",
           "pid_alive", "process_state", "replace_dir", "publish_dir", "write_folder", "check_output_path"]

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
    """Whether process ``pid`` runs on this host.

    A zombie (a process that has exited but that no parent has reaped yet — for good in a container
    whose first process reaps nothing) is not alive: its files and locks are stale.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return process_state(pid) not in ("Z", "X")  # None (no /proc, or gone meanwhile): os.kill's answer stands


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` in ``/proc/PID/stat`` (``R``, ``S``, ``Z`` a zombie, …);
    ``None`` where there is no such file (not Linux, or no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]  # the name in (…) may hold spaces and parentheses


def _parse_temp(name: str) -> tuple[str, str, int] | None:
    """``(dest name, tag, pid)`` of a temp name of this host (``.NAME.TAG-PID-HOST-RANDOM``), else None."""
    head, *tail = name.rsplit("-", 3)
    if len(tail) != 3 or not name.startswith(".") or not tail[0].isdigit() or tail[1] != _host():
        return None
    dest, _, tag = head[1:].rpartition(".")
    if not dest or not tag.isidentifier():
        return None
    return dest, tag, int(tail[0])


def _remove_if_stale(p: Path, dest: Path, tag: str, pid: int) -> bool:
    if pid_alive(pid):
        return False
    if tag == "old" and not dest.exists():  # killed between the two renames of replace_dir
        os.replace(p, dest)
        return False
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)
    return True


def clean_stale_temps(dest: str | os.PathLike) -> list[Path]:
    """Remove temp files/folders of ``dest`` left by dead processes of this host; return them.

    An old folder that :func:`replace_dir` had moved aside when its process died is put back at
    ``dest`` when ``dest`` is missing.
    """
    dest = Path(dest)
    removed = []
    if not dest.parent.is_dir():
        return removed
    for p in dest.parent.glob(f".{_glob_escape(dest.name)}.*-*-*-*"):
        parsed = _parse_temp(p.name)
        if parsed and parsed[0] == dest.name and _remove_if_stale(p, dest, parsed[1], parsed[2]):
            removed.append(p)
    return removed


def clean_stale_temps_in(folder: str | os.PathLike) -> list[Path]:
    """:func:`clean_stale_temps` for every destination in ``folder``; return the removed temps."""
    folder = Path(folder)
    removed = []
    if not folder.is_dir():
        return removed
    for p in folder.glob(".*.*-*-*-*"):
        parsed = _parse_temp(p.name)
        if parsed and _remove_if_stale(p, folder / parsed[0], parsed[1], parsed[2]):
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


@contextmanager
def atomic_file(dest: str | os.PathLike) -> Iterator[Path]:
    """A temp path beside ``dest`` to write; published at ``dest`` when the block ends normally.

    On an exception (or an interrupt) the temp file is removed and ``dest`` is left as it was::

        with atomic_file(path) as tmp:
            fig.savefig(tmp, format="png")
    """
    dest = Path(dest)
    fd, tmp = make_temp_file(dest)
    os.close(fd)
    try:
        yield tmp
        publish_file(tmp, dest)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        full = disk_full(e, dest)
        if full is not None:
            raise full from e
        raise


def publish_file(tmp: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Put the finished file ``tmp`` at ``dest``: fsync, the permissions of a normal new file
    (temp files are created 0600), one rename, fsync of the folder."""
    tmp, dest = Path(tmp), Path(dest)
    fault_point("fs.publish")
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, dest)
    _fsync_dir(dest.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder, fsync, and a rename."""
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


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


PUBLISH_HOW = ("replace", "new", "merge")


def publish_dir(tmp: str | os.PathLike, dest: str | os.PathLike, *, how: str = "replace",
                last: str | None = None, owned: Iterable[str] = (), fault: str | None = None,
                sync: bool = False) -> None:
    """Put the finished folder ``tmp`` at ``dest``.

    Args:
        tmp: the folder assembled aside (by :func:`make_temp_dir` of ``dest``); gone afterwards.
        dest: where it goes.
        how: ``"replace"``: a folder at ``dest`` is replaced as a whole (:func:`replace_dir`);
            ``"new"``: ``dest`` must be missing or an empty folder (removed first), else the
            ``OSError`` of the rename is raised and ``dest`` is untouched; ``"merge"``: the files of
            ``tmp`` are renamed one by one into the existing folder ``dest`` (sorted, ``last`` last,
            so that it appears only once the others are in place), then the names of ``owned`` that
            ``tmp`` lacked are removed from ``dest``; every other entry of ``dest`` is kept.
        last: for ``"merge"``: the name to put in place last.
        owned: for ``"merge"``: the names an old version at ``dest`` may hold (removed unless new).
        fault: for ``"merge"``: the fault point (:mod:`qkv._faults`) passed once the first file is in place.
        sync: fsync every file of ``tmp`` first.

    Raises:
        ValueError: ``how`` is not one of :data:`PUBLISH_HOW`.
        OSError: the rename failed.
    """
    tmp, dest = Path(tmp), Path(dest)
    check_choice("how", how, PUBLISH_HOW)
    fault_point("fs.publish")
    if sync:
        for f in tmp.iterdir():
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
    if how == "replace":
        replace_dir(tmp, dest)
        return
    if how == "new":
        if dest.exists():
            dest.rmdir()
        os.replace(tmp, dest)
    else:
        names = sorted(p.name for p in tmp.iterdir())
        names.sort(key=lambda n: n == last)
        for i, name in enumerate(names):
            os.replace(tmp / name, dest / name)
            if i == 0 and fault:
                fault_point(fault)
        tmp.rmdir()
        for name in sorted(set(owned) - set(names)):
            (dest / name).unlink(missing_ok=True)
    _fsync_dir(dest.parent)


@contextmanager
def write_folder(dest: str | os.PathLike, *, how: str = "replace",
                 on_conflict: Callable[[OSError], bool] | None = None, **publish) -> Iterator[Path]:
    """An empty temp folder beside ``dest`` to fill; published at ``dest`` when the block ends normally.

    The parent of ``dest`` is created. On an exception (or an interrupt) inside the block, or a
    failed publication, the temp folder is removed and ``dest`` is left as it was::

        with write_folder(out, how="new") as tmp:
            (tmp / "meta.json").write_text(...)

    Args:
        dest: the folder to write.
        how: how it is published (see :func:`publish_dir`).
        on_conflict: called with the ``OSError`` of a failed publication (e.g. another process
            made ``dest`` meanwhile); return True when ``dest`` now holds an equivalent folder (the
            error is then dropped), False to raise it — or raise an error of its own.
        **publish: ``last``, ``owned``, ``fault``, ``sync`` of :func:`publish_dir`.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(dest)
    try:
        yield tmp
        try:
            publish_dir(tmp, dest, how=how, **publish)
        except OSError as e:
            if on_conflict is None or not on_conflict(e):
                raise
    except Exception as e:
        full = disk_full(e, dest)
        if full is not None:
            raise full from e
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_output_path(path: str | os.PathLike, what: str = "--out", *,
                      inputs: tuple[str | os.PathLike, ...] = (), replace: bool = True) -> None:
    """Fail early, before any computation, when ``path`` cannot be created or replaced, is one of
    the command's ``inputs`` (compared as resolved paths, symbolic links followed: an output never
    overwrites what it is computed from), or exists while ``replace`` is False (a command's earlier
    result is replaced only with ``--force``).

    Raises:
        QkvError: an ancestor is a file, the nearest existing folder is not writable, ``path`` itself
            is a folder where a file is expected, ``path`` is an input, or it exists and may not be
            replaced.
    """
    path = Path(path)
    for source in inputs:
        if str(source) == "-":
            continue
        if os.path.exists(source) and path.exists() and os.path.samefile(source, path) \
                or Path(source).resolve() == path.resolve():
            raise QkvError(f"{what} {path} is the input {source}; writing it would overwrite what it is "
                           f"computed from: choose another {what}")
    if path.is_dir():
        raise QkvError(f"{what} {path} is a folder; give a file name")
    if not replace and (path.exists() or path.is_symlink()):
        raise QkvError(f"{what} {path} exists; add --force to replace it (the old file stays until the new one "
                       "is complete), or choose another {what}".replace("{what}", what))
    probe = path.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise QkvError(f"{what} {path}: {probe} is a file, not a folder; choose another {what}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise QkvError(f"{what} {path}: {probe} is not writable; choose another {what}")
