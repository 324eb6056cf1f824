"""Run a lab grid: every cell × seed trained by :func:`~qkv.lab.encoder_run.train_on_task`, resumable,
``--jobs`` at once, then the report (:mod:`qkv.lab.report`).

Folder ``OUT``::

    OUT/runs/<cell>/seed<k>.json   one run's result (its configuration included), written atomically
    OUT/runs/<cell>/seed0.pt       seed 0's trained weights (for the attention maps)
    OUT/results.csv  OUT/results.md  OUT/accuracy.png  OUT/attention.png

A run whose ``seed<k>.json`` holds the same configuration is not trained again, so rerunning the
same command after an interruption continues where it stopped; a file there with another
configuration is refused (nothing is overwritten — choose another ``--out``).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qkv._fs import atomic_file, atomic_write_text
from qkv.hardware import threads_per_job
from qkv.lab.grid import Cell, LabGrid, load_lab_grid, run_fields
from qkv.validation import MAX_SEEDS, check_at_most, check_int
from qkv.lab.encoder_config import EncoderTaskConfig
from qkv.lab.encoder_run import train_on_task
from qkv.lab.report import write_report
from qkv.training.stop import end_with_parent
from tqdm.auto import tqdm
import torch

__all__ = ["LabRunConfig", "LabResult", "run_lab", "run_path"]


@dataclass(frozen=True)
class LabRunConfig:
    """What ``qkv ablate --grid lab-…`` was asked.

    Attributes:
        grid: a lab grid name or file, or a :class:`LabGrid`.
        out: the harness folder. seeds: seeds 0 … seeds−1. jobs: runs trained at once.
        threads: torch threads per run (default: cores // jobs, at most ``OMP_NUM_THREADS``).
        overrides: run fields over every cell (``--steps``, ``--set``; ``model`` merged).
        variants: only these variants (default: all).
        command: the command line, for the report.
    """

    grid: str | LabGrid
    out: str
    seeds: int = 3
    jobs: int = 1
    threads: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    variants: tuple[str, ...] | None = None
    command: str = ""

    def __post_init__(self) -> None:
        check_int("seeds", self.seeds, low=1)
        check_at_most("seeds", self.seeds, MAX_SEEDS, why="runs per variant")
        check_int("jobs", self.jobs, low=1)
        check_int("threads", self.threads, low=1, optional=True)
        if not isinstance(self.out, (str, os.PathLike)) or not str(self.out):
            raise ValueError("--out required: the lab's folder (rerun the same command to continue)")
        if Path(self.out).expanduser().exists() and not Path(self.out).expanduser().is_dir():
            raise ValueError(f"--out {self.out} is a file; give a folder")

    def load(self) -> LabGrid:
        grid = self.grid if isinstance(self.grid, LabGrid) else load_lab_grid(self.grid)
        return grid.subset(self.variants) if self.variants else grid

    def per_run_threads(self) -> int:
        return self.threads or threads_per_job(self.jobs)


@dataclass
class LabResult:
    """What :func:`run_lab` did: ``status`` ``"done"`` or ``"interrupted"``, the report's table and
    comparisons, and the errors of failed runs (cell/seed label → message)."""

    out: Path
    status: str
    table: str
    comparisons: list
    errors: dict[str, str]
    trained: int
    skipped: int


def run_path(out: Path, cell: str, seed: int) -> Path:
    return out / "runs" / cell / f"seed{seed}.json"


def _train(fields: dict, seed: int, threads: int, json_path: str, state_path: str | None) -> dict:
    """One run in a worker (or in this process): train, write the result (and seed 0's weights)."""
    torch.set_num_threads(threads)
    result = train_on_task(EncoderTaskConfig(**fields, seed=seed))
    data = result.to_dict()
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    if state_path:
        with atomic_file(state_path) as tmp:
            torch.save(result.model.state_dict(), tmp)
    atomic_write_text(json_path, json.dumps(data))
    return data


def _existing(path: Path, wanted: dict) -> dict | None:
    """The stored result when it is of the same run; ``None`` when there is none.

    Raises:
        ValueError: a result of another configuration (or an unreadable one) is there.
    """
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable ({e}); move it away or use another --out") from None
    if data.get("config") != wanted:
        stored = data.get("config") or {}
        keys = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
        raise ValueError(f"{path}: a run with another configuration is there (differs in {', '.join(keys)}); "
                         "use another --out, or the options it was made with")
    return data


def _plan(config: LabRunConfig, grid: LabGrid, out: Path) -> tuple[list[tuple[Cell, int, dict]], dict]:
    """``(to train: (cell, seed, fields), done: (cell, seed) → result)``."""
    todo, done = [], {}
    for cell in grid.cells(config.overrides):
        fields = run_fields(grid, cell.overrides)
        for seed in range(config.seeds):
            try:
                wanted = EncoderTaskConfig(**fields, seed=seed).to_dict()
            except (TypeError, ValueError) as e:
                raise ValueError(f"grid {grid.name}, cell {cell.name}: {e}") from None
            stored = _existing(run_path(out, cell.name, seed), json.loads(json.dumps(wanted)))
            if stored is None:
                todo.append((cell, seed, fields))
            else:
                done[(cell.name, seed)] = stored
    return todo, done


def run_lab(config: LabRunConfig, log: Callable[[str], None] = print, progress: bool = True) -> LabResult:
    """Train what is missing, then write the report (see the module docstring)."""
    grid = config.load()
    out = Path(config.out).expanduser()
    todo, done = _plan(config, grid, out)
    skipped = len(done)
    threads = config.per_run_threads()
    log(f"lab grid {grid.name}: {len(todo)} runs to train, {skipped} already done "
        f"({config.jobs} at once, {threads} threads each) -> {out}")
    errors: dict[str, str] = {}
    status = "done"
    bar = _bar(len(todo), progress)
    args = [(fields, seed, threads, str(run_path(out, cell.name, seed)),
             str(run_path(out, cell.name, seed).with_suffix(".pt")) if seed == 0 else None)
            for cell, seed, fields in todo]
    labels = [f"{cell.name}/seed{seed}" for cell, seed, _ in todo]
    try:
        if config.jobs == 1:
            for (cell, seed, _), label, a in zip(todo, labels, args):
                _collect(done, errors, (cell.name, seed), label, lambda a=a: _train(*a), bar)
        else:
            ctx = multiprocessing.get_context("spawn")
            with cf.ProcessPoolExecutor(max_workers=config.jobs, mp_context=ctx,
                                        initializer=end_with_parent) as pool:  # a lab killed -9 takes its workers
                futures = {pool.submit(_train, *a): (key, label) for key, label, a in
                           zip([(c.name, s) for c, s, _ in todo], labels, args)}
                try:
                    for fut in cf.as_completed(futures):
                        key, label = futures[fut]
                        _collect(done, errors, key, label, fut.result, bar)
                except KeyboardInterrupt:
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
    except KeyboardInterrupt:
        status = "interrupted"
    finally:
        bar.close()
    table, comparisons = write_report(grid, config, out, done)
    return LabResult(out, status, table, comparisons, errors, len(done) - skipped, skipped)


def _collect(done: dict, errors: dict, key: tuple[str, int], label: str, get, bar) -> None:
    try:
        done[key] = get()
    except (ValueError, RuntimeError, OSError) as e:
        errors[label] = f"{type(e).__name__}: {e}"
    bar.update(1)
    bar.set_postfix_str(label)


def _bar(total: int, progress: bool):
    return tqdm(total=total, unit="run", dynamic_ncols=True, disable=not progress or total == 0)
