"""The ablation harness: plan every (variant, seed) run, run what is missing, write the report.

    OUT/
      ablation.json        the grid, the command-line overrides and the seeds of the last invocation
      shared.json, data/, tokenizer/     the shared held-out text and tokenizer (qkv.experiments.data)
      runs/<variant>/seed<k>/            a qkv pretrain run folder + result.json (+ early_stats.json)
      runs/<variant>/seed<k>.lock        held while a process trains that run
      logs/<variant>-seed<k>.log         output of a run trained in its own process (--jobs > 1)
      results.csv, results.md, loss_curves.png

Rerunning the same command continues: finished runs (``result.json``) are skipped, an unfinished
run resumes from its last checkpoint (bit-identically: see :mod:`qkv.training.loop`), and a run
whose stored configuration differs from the planned one stops the harness before any training.
Several harness processes may work on one folder: a run locked by a live process is left to it.
With ``reuse``, runs of other harness folders that are the same run (configuration, seed, tokenizer,
text) are copied instead of trained (:mod:`qkv.experiments.reuse`).

With ``jobs > 1`` runs train in separate processes, each with ``threads`` torch threads (default
``cores // jobs``, at most ``OMP_NUM_THREADS``). Numbers depend only on the seed and the configuration — not on ``jobs`` — as
long as the thread count is the same (float summation order can depend on it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qkv._fs import pid_alive
from qkv.experiments.data import prepare_shared_data
from qkv.experiments.grid import Grid, load_grid
from qkv.experiments.plan import Job, merge_overrides, plan_jobs, validate_grid
from qkv.experiments.report import write_report
from qkv.experiments.reuse import check_sources, reuse_runs
from qkv.experiments.worker import is_finished, read_result, run_job
from qkv.hardware import threads_per_job
from qkv._fs import atomic_write_text
from qkv.training.config import TrainConfig
from qkv.training.stop import end_with_parent
from qkv.validation import MAX_SEEDS, check_at_most, check_int
import torch

__all__ = ["AblationConfig", "AblationResult", "run_ablation"]


@dataclass(frozen=True)
class AblationConfig:
    """What ``qkv ablate`` runs.

    Attributes:
        grid: a built-in grid name or the path of a grid file.
        corpus: training corpus specs; eval_corpus: held-out specs (see :mod:`qkv.experiments.data`).
        out: the harness folder.
        seeds: runs per variant, with seeds ``0 … seeds-1``.
        jobs: runs trained at the same time, each in its own process when > 1.
        threads: torch threads per run (default: cores // jobs, at most ``OMP_NUM_THREADS``).
        overrides: TrainConfig fields and ``model`` overrides applied to every variant (the
            command line's ``--steps``, ``--set``, …), below the variants' own settings.
        command: the command line, recorded in ``results.md``.
        variants: train only these of the grid's variants (None: all); the report covers them.
        reuse: other harness folders whose trained runs are copied instead of trained again when
            they are the same run (:mod:`qkv.experiments.reuse`).
    """

    grid: str
    corpus: tuple[str, ...]
    out: str
    eval_corpus: tuple[str, ...] | None = None
    seeds: int = 3
    jobs: int = 1
    threads: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    variants: tuple[str, ...] | None = None
    reuse: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.corpus, str):
            object.__setattr__(self, "corpus", (self.corpus,))
        object.__setattr__(self, "corpus", tuple(str(c) for c in self.corpus))
        if isinstance(self.eval_corpus, str):
            object.__setattr__(self, "eval_corpus", (self.eval_corpus,))
        if isinstance(self.reuse, (str, Path)):
            object.__setattr__(self, "reuse", (self.reuse,))
        object.__setattr__(self, "reuse", tuple(str(r) for r in self.reuse))
        if not self.corpus:
            raise ValueError("corpus is empty: give at least one file, folder or dataset:NAME")
        for name in ("seeds", "jobs"):
            check_int(name, getattr(self, name), low=1)
        check_at_most("seeds", self.seeds, MAX_SEEDS, why="runs per variant")
        check_int("threads", self.threads, low=1, optional=True, allow_bool=True, tail=" or None")


@dataclass
class AblationResult:
    """What :func:`run_ablation` reports.

    Attributes:
        status: ``complete`` (every run finished), ``interrupted`` or ``incomplete`` (runs left to
            other processes, or failed with an error: see ``errors``).
        rows: one result per finished run (``result.json`` contents).
        missing: labels of runs without a result.
        table: the Markdown results table.
    """

    out: Path
    grid: Grid
    status: str
    rows: list[dict]
    missing: list[str]
    errors: dict[str, str]
    table: str


def _lock_path(job: Job) -> Path:
    run = Path(job.run_dir)
    return run.parent / f"{run.name}.lock"


def _try_lock(job: Job) -> int | None:
    """Take the run's lock (stale locks of dead processes are taken over); the holder's pid if busy."""
    path = _lock_path(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(path.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and pid != os.getpid() and pid_alive(pid):
                return pid
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return None
    return -1


def _unlock(job: Job) -> None:
    _lock_path(job).unlink(missing_ok=True)


def _check_existing(jobs: list[Job]) -> None:
    """Refuse to mix: an existing run folder must hold the run this plan would train."""
    for job in jobs:
        meta = Path(job.run_dir) / "run.json"
        if meta.is_file():
            stored = TrainConfig.from_dict(json.loads(meta.read_text(encoding="utf-8"))["train_config"])
            diff = stored.diff(job.config())
            if diff:
                raise ValueError(f"{job.run_dir} holds a run with another configuration than the grid now "
                                 "plans: " + "; ".join(diff) + "; use another --out (or delete that run)")


def _finish_line(job: Job, row: dict) -> str:
    if row.get("status") == "failed":
        return f"{job.label}: failed — {row.get('error', '')}"
    return (f"{job.label}: held-out loss {row['eval_loss']:.4f}, accuracy {row['accuracy']:.4f}, "
            f"{row['params']:,} parameters")


def _execute(jobs: list[Job], *, n_jobs: int, threads: int, out: Path, log: Callable[[str], None]):
    """Run every unfinished job; returns (interrupted, errors)."""
    queue: deque[Job] = deque()
    for job in jobs:
        if is_finished(job):
            log(f"skip {job.label}: finished")
        else:
            queue.append(job)
    running: dict[str, tuple[Job, subprocess.Popen]] = {}  # label → (job, its process)
    errors: dict[str, str] = {}
    interrupted = False
    total, started = len(queue), 0
    try:
        while (queue and not interrupted) or running:
            while queue and len(running) < n_jobs and not interrupted:
                job = queue.popleft()
                holder = _try_lock(job)
                if holder is not None:
                    log(f"skip {job.label}: being trained by process {holder}")
                    continue
                if is_finished(job):
                    _unlock(job)
                    log(f"skip {job.label}: finished")
                    continue
                started += 1
                log(f"[{started}/{total}] {job.label}")
                if n_jobs == 1:
                    try:
                        row = _run_inline(job, threads, log)
                    except Exception as e:  # one broken run must not stop the others
                        errors[job.label] = f"{type(e).__name__}: {e}"
                        log(f"{job.label}: error — {errors[job.label]}")
                        continue
                    finally:
                        _unlock(job)
                    if row["status"] == "interrupted":
                        interrupted = True
                        log(f"{job.label}: interrupted; checkpoint saved")
                    else:
                        log(_finish_line(job, row))
                else:
                    running[job.label] = (job, _spawn(job, threads, out))
            for label, (job, proc) in list(running.items()):
                rc = proc.poll()
                if rc is None:
                    continue
                del running[label]
                _unlock(job)
                if rc == 0 and is_finished(job):
                    log(_finish_line(job, read_result(job)))
                elif rc == 130 or rc == -2 or rc == -15:
                    interrupted = True
                    log(f"{job.label}: interrupted; checkpoint saved")
                else:
                    log_file = out / "logs" / f"{job.variant}-seed{job.seed}.log"
                    tail = ""
                    if log_file.is_file():
                        tail = log_file.read_text(encoding="utf-8", errors="replace")[-2000:]
                    errors[job.label] = f"exit status {rc}; see {log_file}"
                    log(f"{job.label}: error (exit status {rc}); last output:\n{tail}")
            if running:
                time.sleep(0.2)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: waiting for the running runs to save a checkpoint")
        for job, proc in running.values():
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
            _unlock(job)
    return interrupted, errors


def _run_inline(job: Job, threads: int, log) -> dict:
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return run_job(job, log=log)
    finally:
        torch.set_num_threads(old)


def _spawn(job: Job, threads: int, out: Path) -> subprocess.Popen:
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    spec = logs / f"{job.variant}-seed{job.seed}.job.json"
    atomic_write_text(spec, json.dumps(job.to_dict(), indent=1))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    log_file = open(logs / f"{job.variant}-seed{job.seed}.log", "a", encoding="utf-8")
    try:
        command = [sys.executable, "-m", "qkv.experiments.worker", str(spec), "--threads", str(threads)]
        return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=end_with_parent)  # a harness killed -9 takes its workers with it
    finally:
        log_file.close()


def run_ablation(cfg: AblationConfig, *, log: Callable[[str], None] = print) -> AblationResult:
    """Run (or continue) the grid ``cfg.grid`` into ``cfg.out`` and write the report.

    Every configuration error — a bad grid, a bad override, a corpus problem, an existing run that
    differs from the plan — raises ``ValueError`` before any training.
    """
    grid = load_grid(cfg.grid)
    if cfg.variants is not None:
        grid = grid.subset(cfg.variants)
    validate_grid(grid, cfg.overrides)
    check_sources(cfg.reuse)
    out = Path(cfg.out)
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)
                if f.default is not dataclasses.MISSING}
    fields = {**defaults, **merge_overrides(grid.base, cfg.overrides)}
    shared = prepare_shared_data(out, cfg.corpus, cfg.eval_corpus, fields, log=log)
    jobs = plan_jobs(grid, out, list(range(cfg.seeds)), overrides=cfg.overrides,
                     data_fields=shared["data_fields"])
    _check_existing(jobs)
    if cfg.reuse:
        reuse_runs(jobs, out, cfg.reuse, lock=_try_lock, unlock=_unlock, log=log)
    atomic_write_text(out / "ablation.json", json.dumps(
        {"grid": grid.to_dict(), "grid_source": grid.source, "corpus": list(cfg.corpus),
         "eval_corpus": list(cfg.eval_corpus) if cfg.eval_corpus else None, "seeds": cfg.seeds,
         "overrides": cfg.overrides, "variants": list(grid.variants), "command": cfg.command}, indent=2))
    threads = cfg.threads or threads_per_job(cfg.jobs)
    log(f"grid {grid.name}: {len(grid.variants)} variants × {cfg.seeds} seeds = {len(jobs)} runs into {out} "
        f"({cfg.jobs} at a time, {threads} thread{'s' if threads > 1 else ''} each)")
    interrupted, errors = _execute(jobs, n_jobs=cfg.jobs, threads=threads, out=out, log=log)
    rows = [r for r in (read_result(j) for j in jobs) if r is not None]
    missing = [j.label for j in jobs if not is_finished(j)]
    table = write_report(out, grid, jobs, rows, how=shared["how"], command=cfg.command)
    status = "interrupted" if interrupted else ("incomplete" if missing else "complete")
    if missing:
        log(f"{len(missing)} run(s) without results ({', '.join(missing)}); "
            "rerun the same command to continue")
    return AblationResult(out, grid, status, rows, missing, errors, table)
