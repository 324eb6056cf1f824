"""Peak-memory measurement shared by the benchmark scripts (Linux first, portable fallback).

Each measurement runs in a fresh subprocess of the calling script, so that one call's peak is not
hidden by an earlier, larger one: :func:`run_in_subprocess` starts it, and the child measures its
call with :func:`peak_rss_growth`.

The ``--memory`` tables of ``generate.py``, ``embed.py`` and ``finetune.py`` run each side alone the
same way: the parent calls :func:`measure_alone` with the child's arguments; the child loads its
model, calls :func:`mark_peak` (restarts the peak mark, notes the resident MB), does its work and
calls :func:`print_peak`, which prints the line :func:`measure_alone` reads.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

__all__ = ["mark_peak", "measure_alone", "peak_mb", "peak_rss_growth", "print_peak", "rss_mb", "run_in_subprocess"]


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS (Linux ≥ 4.0)
        return True
    except OSError:
        return False


def rss_mb() -> float:
    """This process's resident MB now (``VmRSS``)."""
    return (_status_kib("VmRSS") or 0) / 1024


def peak_mb() -> float:
    """This process's peak resident MB (``VmHWM``: unlike ``ru_maxrss``, not inherited across exec)."""
    return (_status_kib("VmHWM") or 0) / 1024


def mark_peak() -> tuple[float, bool]:
    """Restart the peak mark at the current resident size where the kernel allows (Linux ``clear_refs``
    5); ``(resident MB now, whether the mark was restarted)``."""
    reset = _reset_peak()
    return rss_mb(), reset


def print_peak(mark: tuple[float, bool]) -> None:
    """Print what :func:`measure_alone` reads: the resident MB at ``mark``, the peak since, whether the
    mark was restarted (else the peak includes loading)."""
    before, reset = mark
    print(before, peak_mb(), int(reset), flush=True)


def measure_alone(argv: list[str], timeout: float | None = None) -> dict:
    """Run ``python *argv`` (a child that ends with :func:`print_peak`) and read its last line:
    ``{"loaded_mb", "peak_mb", "growth_mb", "peak_includes_loading"}``. A child that fails raises
    ``RuntimeError`` with its last line of stderr."""
    done = subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True, timeout=timeout,
                          check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"memory child {' '.join(map(str, argv[:3]))} … failed (exit {done.returncode}): {last}")
    before, peak, reset = done.stdout.split()[-3:]
    return {"loaded_mb": float(before), "peak_mb": float(peak), "growth_mb": float(peak) - float(before),
            "peak_includes_loading": reset != "1"}


def _maxrss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def peak_rss_growth(call: Callable[[], Any]) -> tuple[int, str, Any]:
    """Run ``call()`` and return ``(peak bytes above the RSS before it, method, its result)``.

    Exact where Linux lets the high-water mark be reset (``/proc/self/clear_refs``); elsewhere the
    growth of ``ru_maxrss``, a lower bound.
    """
    exact = _reset_peak()
    rss0 = _status_kib("VmRSS")
    maxrss0 = _maxrss_bytes()
    result = call()
    hwm = _status_kib("VmHWM") if exact and rss0 is not None else None
    if hwm is not None:
        return (hwm - rss0) * 1024, "VmHWM after clear_refs, minus VmRSS before", result
    return max(0, _maxrss_bytes() - maxrss0), "ru_maxrss growth (lower bound)", result


def run_in_subprocess(script: str | Path, flag: str, spec: dict, timeout: float | None = None) -> dict:
    """Run ``python script flag JSON(spec)`` and return the JSON dict its last stdout line holds,
    or ``{"error": …}``."""
    cmd = [sys.executable, str(Path(script).resolve()), flag, json.dumps(spec)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])
