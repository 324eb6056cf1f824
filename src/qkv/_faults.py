"""Fault-injection points: :func:`fault_point` marks a place where a crash matters.

The test suite (``tests/faults/``) kills real processes exactly there. With the environment variable
``QKV_FAULT_PAUSE="NAME[,NAME…]:SECONDS"``, a process that reaches a named point appends the name
to the file ``$QKV_FAULT_MARK`` (when set) and sleeps ``SECONDS`` — a window in which the test
sends ``kill -9``. Without the variable a point costs one environment lookup. The points:

    checkpoint.write     a checkpoint half-written in its temporary folder
    checkpoint.latest    the checkpoint folder in place, ``LATEST`` not yet switched
    finalise.model       the final model half-published into the run folder
    finalise.run_json    the final model written, ``run.json`` not yet marked complete

and the readiness points ``stop.installed`` (the training loop's signal handlers are in place),
``cli.start`` (the command line's handler is in place, nothing parsed or imported yet) and
``cli.parsed`` (the command's parser built — its library imported — and the arguments parsed).

With ``QKV_FAULT_RAISE="NAME[,NAME…][:ENOSPC]"`` a process that reaches a named point raises instead:
an ``OSError(ENOSPC)`` with ``:ENOSPC`` (a full disk), else an :class:`InjectedFault` — a stand-in for
any failure there. The points where a raise matters:

    fs.publish           a finished file or folder about to be renamed into place (``qkv._fs``)
    train.step           the start of every optimiser step (``qkv.training.engine``)
"""

from __future__ import annotations

import errno
import os
import time

__all__ = ["POINTS", "InjectedFault", "fault_point"]

POINTS = ("checkpoint.write", "checkpoint.latest", "finalise.model", "finalise.run_json")


class InjectedFault(RuntimeError):
    """The error a fault point raises under ``$QKV_FAULT_RAISE`` (see the module docstring)."""


def fault_point(name: str) -> None:
    """Pause here if ``$QKV_FAULT_PAUSE`` names ``name``, raise if ``$QKV_FAULT_RAISE`` does (see the
    module docstring)."""
    if os.environ.get("QKV_FAULT_RAISE"):
        _raise_at(name)
    spec = os.environ.get("QKV_FAULT_PAUSE")
    if not spec:
        return
    names, _, seconds = spec.rpartition(":")
    if name not in names.split(","):
        return
    mark = os.environ.get("QKV_FAULT_MARK")
    if mark:
        with open(mark, "a", encoding="utf-8") as fh:
            fh.write(name + "\n")
    time.sleep(float(seconds))


def _raise_at(name: str) -> None:
    names, _, kind = os.environ["QKV_FAULT_RAISE"].partition(":")
    if name not in names.split(","):
        return
    if kind == "ENOSPC":
        raise OSError(errno.ENOSPC, "No space left on device")
    raise InjectedFault(f"fault injected at {name} (QKV_FAULT_RAISE)")
