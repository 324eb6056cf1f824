"""A failed write told from a full disk: :func:`disk_full` turns a writer's error into one
``OSError(ENOSPC)`` naming the destination and the free space (the atomic writes of
:mod:`qkv._fs` raise it in place of the writer's own message)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

__all__ = ["disk_full", "NEARLY_FULL"]

#: Free bytes under which a failed write is taken for a full disk when the writer's own error does not say
#: (PyTorch's zip writer reports "enforce fail at inline_container.cc … unexpected pos").
NEARLY_FULL = 64 << 20


def disk_full(exc: BaseException, dest: str | os.PathLike) -> OSError | None:
    """An ``OSError(ENOSPC)`` naming ``dest`` and the free space when ``exc`` is a write that failed for want
    of space — an ``OSError`` with ENOSPC, a library's error that says so (safetensors: "No space left on
    device"), or any error of a writer while the file system holds under :data:`NEARLY_FULL` free — else
    ``None``."""
    if isinstance(exc, OSError) and exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    text = str(exc)
    said = isinstance(exc, OSError) or "No space left on device" in text or "os error 28" in text
    if not said and not isinstance(exc, RuntimeError) and type(exc).__name__ != "SafetensorError":
        return None
    try:
        free = shutil.disk_usage(next(p for p in (Path(dest), *Path(dest).parents) if p.exists())).free
    except (OSError, StopIteration):
        free = None
    if not said and (free is None or free >= NEARLY_FULL):
        return None
    room = f"{free / 2**20:.1f} MiB free there" if free is not None else "the disk is full"
    return OSError(errno.ENOSPC, f"No space left on device ({room})",
                   str(dest))
