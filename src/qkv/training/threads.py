"""Adaptive intra-op threads for time-budgeted training on a shared machine.

On a 2-core machine that is otherwise idle, two threads train a small model about 1.85× faster
than one. With one other CPU-bound process running, the same two threads are 1.6× *slower* than
one (measured, ``cpu-small``: 1203 ms a step against 762 ms): every parallel region waits for the
thread that the other process pre-empted. Which is faster depends on a load that can change at
any time, so :class:`ThreadGovernor` measures instead of guessing: it trains with the most
threads, and every ``probe_every_s`` seconds tries the other count for a few steps, keeping
whichever had the lower median step time.

Thread counts change only the order of floating-point sums, never what is computed; they are
used only for time-budgeted runs (which are not bit-reproducible anyway, see
:mod:`qkv.training.budget`).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable

import torch

__all__ = ["ThreadGovernor", "thread_governor"]


class ThreadGovernor:
    """Chooses the intra-op thread count by measured step time.

    Args:
        max_threads: the largest count (and the starting one); the other candidate is 1.
        probe_every_s: seconds between probes of the count not in use.
        first_probe_s: seconds before the first probe (a load present from the start is found early).
        probe_steps: steps per probe (the first is discarded: caches warm up).
        window: recent step times kept per count.
        set_threads: how to apply a count (tests pass a recorder); default ``torch.set_num_threads``.
        clock: a monotonic clock in seconds.
    """

    def __init__(self, max_threads: int | None = None, *, probe_every_s: float = 60.0, first_probe_s: float = 10.0,
                 probe_steps: int = 4,
                 window: int = 8, set_threads: Callable[[int], None] = torch.set_num_threads,
                 clock: Callable[[], float] = time.monotonic):
        self.max_threads = int(max_threads or torch.get_num_threads())
        self.candidates = (self.max_threads, 1) if self.max_threads > 1 else (1,)
        self.probe_every_s, self.probe_steps = probe_every_s, max(2, probe_steps)
        self.times = {n: deque(maxlen=window) for n in self.candidates}
        self._set, self._clock = set_threads, clock
        self.current = self.preferred = self.candidates[0]
        self._probe_left, self._skip = 0, False
        self._next_probe = clock() + min(first_probe_s, probe_every_s)
        self.switches: list[tuple[float, int]] = []  # (time, count) whenever the preferred count changes
        self._set(self.current)

    def _use(self, n: int) -> None:
        if n != self.current:
            self._set(n)
            self.current = n

    def record(self, seconds: float) -> None:
        """Report one training step's duration; may change the thread count for the next step."""
        if self._skip:
            self._skip = False  # the first step after a switch warms caches: not counted
        else:
            self.times[self.current].append(seconds)
        if len(self.candidates) == 1:
            return
        if self._probe_left:
            self._probe_left -= 1
            if self._probe_left == 0:
                self._decide()
            return
        if self._clock() >= self._next_probe and len(self.times[self.preferred]) >= 2:
            other = next(n for n in self.candidates if n != self.preferred)
            self.times[other].clear()  # the load may have changed since it was last measured
            self._use(other)
            self._probe_left, self._skip = self.probe_steps, True

    def _decide(self) -> None:
        med = {n: statistics.median(t) for n, t in self.times.items() if t}
        best = min(med, key=med.get)
        if best != self.preferred:
            self.preferred = best
            self.switches.append((self._clock(), best))
            # the old preference's times are stale now; measure it afresh at the next probe
        self._use(self.preferred)
        self._skip = True
        self._next_probe = self._clock() + self.probe_every_s


def thread_governor(threads: int | str | None) -> ThreadGovernor | None:
    """A training loop's threads: a :class:`ThreadGovernor` for ``"adaptive"``; a number is applied
    (``torch.set_num_threads``) and ``None`` returned, as for ``None`` (torch's default)."""
    if threads == "adaptive":
        return ThreadGovernor()
    if isinstance(threads, int):
        torch.set_num_threads(threads)
    return None
