"""Stop requests of a training run: SIGINT/SIGTERM, honoured within one micro-batch.

The first signal asks the loop to stop: between optimiser steps it sets :attr:`StopFlag.hit` (the
loop saves a checkpoint after the step and exits); inside the gradient-accumulation phase of a
step — before the optimiser touches the weights — it raises :class:`StepAbandoned` at once, so a
step of many micro-batches does not have to finish (the loop then saves the state of the steps
completed so far). A second signal exits the process immediately with status 130; every file qkv
writes is replaced atomically, so the last complete checkpoint stays good.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

from qkv._faults import fault_point

__all__ = ["StopFlag", "StepAbandoned", "stop_requests", "end_with_parent"]


def end_with_parent() -> None:
    """Ask the kernel to send this process SIGTERM when its parent dies (Linux; elsewhere nothing).

    For the worker processes of a harness (``qkv ablate --jobs N``): a harness killed with ``kill -9``
    cannot stop its workers itself, and they would go on training into its folder; with this, each
    stops as for a stop request (a checkpoint, exit), and the rerun continues them. Called in the child
    (``preexec_fn``, a pool's ``initializer``).
    """
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


class StepAbandoned(BaseException):
    """Raised inside a training step's micro-batch phase when a stop is requested (a BaseException,
    so that no `except Exception` on the way swallows it)."""


class StopFlag:
    """Context manager installing the SIGINT/SIGTERM handlers (see the module docstring).

    Attributes:
        hit: a stop was requested.
        abandonable: True while the current step may still be abandoned (no weight changed yet);
            the loop sets it before a step, :meth:`critical` clears it as the optimiser starts.
    """

    def __init__(self, *, allow_abandon: bool = True):
        self.hit = False
        self.abandonable = False
        self.allow_abandon = allow_abandon
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        fault_point("stop.installed")  # tests: the handlers are in place
        return self

    def critical(self, *args, **kwargs) -> None:
        """From here on the step runs to its end (usable as an optimiser step pre-hook)."""
        self.abandonable = False
        return None

    def _handle(self, signum, frame):
        if self.hit:
            sys.stderr.write("\nsecond stop request: exiting now; the last complete checkpoint is kept\n")
            sys.stderr.flush()
            os._exit(130)
        self.hit = True
        if self.abandonable and self.allow_abandon:
            self.abandonable = False
            raise StepAbandoned()

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


class _NoStop:
    """The stop flag of a run without signal handling: never set."""

    hit = False
    abandonable = False


@contextlib.contextmanager
def stop_requests(optimizer, *, enabled: bool, allow_abandon: bool = True):
    """The stop flag of a training loop: with ``enabled`` a :class:`StopFlag` whose step is
    abandonable until ``optimizer`` starts its update; else one that is never set (an in-memory run
    has no folder to save into: a KeyboardInterrupt goes to its caller)."""
    if not enabled:
        yield _NoStop()
        return
    with StopFlag(allow_abandon=allow_abandon) as stop:
        optimizer.register_step_pre_hook(stop.critical)  # a stop request abandons a step only before this
        yield stop
