"""The adaptive thread governor, on a simulated machine whose load changes."""

from __future__ import annotations

import pytest

from qkv.training.config import TrainConfig
from qkv.training.threads import ThreadGovernor

# seconds per step by thread count, measured for cpu-small on 2 cores (idle / one CPU-bound job)
IDLE = {2: 0.43, 1: 0.80}
BUSY = {2: 1.20, 1: 0.76}


def _simulate(phases):
    """Run the governor through ``[(seconds, costs), …]``; return the thread count of every step."""
    t = [0.0]
    applied = []
    gov = ThreadGovernor(2, probe_every_s=20, probe_steps=4, set_threads=applied.append, clock=lambda: t[0])
    used, end = [], 0.0
    for length, costs in phases:
        end += length
        while t[0] < end:
            dt = costs[gov.current]
            used.append((t[0], gov.current))
            t[0] += dt
            gov.record(dt)
    return gov, used, applied


def test_it_keeps_two_threads_on_an_idle_machine_probing_one_now_and_then():
    gov, used, applied = _simulate([(300, IDLE)])
    share_one = sum(n == 1 for _, n in used) / len(used)
    assert gov.preferred == 2 and gov.switches == []
    assert 0 < share_one < 0.1  # the probes cost a few steps
    assert applied[0] == 2


def test_it_moves_to_one_thread_under_load_and_back_when_the_load_ends():
    gov, used, _ = _simulate([(120, IDLE), (240, BUSY), (240, IDLE)])
    assert [n for _, n in gov.switches] == [1, 2]
    (t1, _), (t2, _) = gov.switches
    assert 120 <= t1 <= 120 + 2 * 20 + 10  # within two probe intervals of the change
    assert 360 <= t2 <= 360 + 2 * 20 + 10
    busy = [n for t, n in used if 170 < t < 360]
    assert sum(n == 1 for n in busy) / len(busy) > 0.85  # the rest: probes of two threads


def test_one_core_has_nothing_to_choose():
    applied = []
    gov = ThreadGovernor(1, set_threads=applied.append, clock=lambda: 0.0)
    for _ in range(50):
        gov.record(1.0)
    assert gov.candidates == (1,) and applied == [1]


def test_a_load_present_from_the_start_is_found_at_the_first_probe():
    gov, used, _ = _simulate([(120, BUSY)])
    assert gov.switches and gov.switches[0][0] < 10 + 10  # first probe at 10 s, decided a few steps later


def test_adaptive_threads_need_a_time_budget():
    with pytest.raises(ValueError, match="needs a time_budget"):
        TrainConfig(corpus="x", out="y", threads="adaptive")
    assert TrainConfig(corpus="x", out="y", threads="adaptive", time_budget=1).threads == "adaptive"
    for bad in (0, "two", True):
        with pytest.raises(ValueError, match="threads="):
            TrainConfig(corpus="x", out="y", threads=bad)
