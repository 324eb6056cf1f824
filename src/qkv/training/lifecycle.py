"""The run lifecycle: one home for every run that writes a folder — pretraining, fine-tuning, the
lab's encoder and encoder–decoder runs, contrastive embedding training.

    run_session(device, out, resume=…)   processes set up (torchrun or one), then open_run
    open_run(out, resume=…)              check: a new run needs a free ``out`` (missing or an empty
                                         folder); ``--resume`` one holding a run, which it locks
      run.finished(cfg)                  ``--resume`` of a run that is final: its run.json, nothing redone
      run.check_config(cfg)              ``--resume``: the stored configuration must be this one
      check_resume_data(run, cfg, sha)   ``--resume``: that, and the data those the run started with
      run.create(meta, write=…)          the folder assembled aside and renamed into place with
                                         ``run.json`` (status ``running``) and its lock: born locked
      run_training(…, run=run)           the engine: ``run.start()``, checkpoints, metrics, then
                                         ``run.finish(status, …)`` after the final model
    leaving open_run                     the lock released; an error after the start leaves status
                                         ``failed`` and its message (never ``running``), an interrupt
                                         that escaped the engine ``interrupted``

Statuses: ``running`` → ``complete`` | ``diverged`` (a run whose non-finite loss is reported, not
raised: the lab's) | ``interrupted`` (a stop request; ``--resume`` continues) | ``failed`` (an
error; ``--resume`` continues from the last checkpoint once its cause is fixed). ``complete`` and
``diverged`` are final. Finalisation (the last evaluation, the final checkpoint, the final model,
``run.json``) is idempotent: a crash inside it leaves the final checkpoint, and ``--resume``
repeats the remaining parts from it; ``--resume`` of a final run changes nothing.

Under torchrun only rank 0 touches the folder: the other ranks' :class:`RunFolder` writes nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from qkv._fs import write_folder
from qkv.training import distributed as qdist
from qkv.training.fingerprint import new_run_id
from qkv.training.lock import acquire, release, write_lock
from qkv.training.rundir import RUN_JSON, RunError, check_out_dir, read_run, update_run

__all__ = ["RunFolder", "open_run", "run_session", "check_resume_data", "resume_eval", "STATUSES", "FINAL"]

STATUSES = ("running", "complete", "diverged", "interrupted", "failed")
#: The statuses of a run that is over: ``--resume`` returns its result and changes nothing.
FINAL = ("complete", "diverged")


class RunFolder:
    """One run's folder, from its check to its last status (see the module docstring).

    Attributes:
        out: the folder. resume: whether this process continues a run. writer: whether it writes
            (rank 0). started: the run has begun (created, or its training resumed): an error from
            now on is recorded in ``run.json``.
    """

    def __init__(self, out: str | Path, *, resume: bool, writer: bool = True,
                 error: type[Exception] = RunError):
        self.out, self.resume, self.writer, self.error = Path(out), resume, writer, error
        self.started = False

    def meta(self) -> dict[str, Any]:
        """``run.json`` (checked to be a run's)."""
        return read_run(self.out)

    def create(self, meta: dict[str, Any], write: Callable[[Path], None] | None = None) -> None:
        """Create the folder with ``run.json`` (``meta`` with status ``running`` and a new ``run_id``
        unless it has one) and the lock, atomically; ``write(tmp)`` adds the files a run starts
        with (e.g. its tokenizer). A no-op on ranks other than 0.

        Raises:
            RunError: another process created a folder at ``out`` meanwhile.
        """
        self.started = True
        if not self.writer:
            return
        meta = {"format": "qkv-run", **meta, "status": "running"}
        meta.setdefault("run_id", new_run_id())
        out = self.out

        def taken(e: OSError) -> bool:  # another process created the run meanwhile
            raise self.error(f"{out} was created by another process while this run prepared its data; "
                             f"continue that run with --resume or choose another --out ({e.strerror})") from e

        with write_folder(out, how="new", on_conflict=taken) as tmp:
            if write is not None:
                write(tmp)
            (tmp / RUN_JSON).write_text(json.dumps(meta, indent=2), encoding="utf-8")
            write_lock(tmp)

    def check_config(self, cfg, *, what: str = "started with a different configuration") -> None:
        """Refuse to continue with ``cfg`` when it differs from the stored configuration (the
        fields a resumption may change, e.g. ``progress``, excepted; a moved run is the same run).

        ``cfg``: a :class:`~qkv.training.config.RunConfig` (``from_dict``, ``diff``).

        Raises:
            RunError: naming every field that differs.
        """
        data = dict(self.meta()["train_config"])
        if "out" in data and hasattr(cfg, "out"):
            data["out"] = cfg.out
        diff = type(cfg).from_dict(data).diff(cfg)
        if diff:
            raise self.error(f"--resume: {self.out} was {what}: " + "; ".join(diff))

    def finished(self, cfg, files: tuple[str, ...] = ("qkv.json", "model.safetensors")) -> dict | None:
        """``run.json`` of a run that is final (status complete or diverged, its final evaluation and
        ``files`` there), else ``None``.

        Raises:
            RunError: the run is final but ``cfg`` differs from its configuration.
        """
        meta = self.meta()
        if meta.get("status") not in FINAL or not isinstance(meta.get("final_eval"), dict):
            return None
        if not all((self.out / f).exists() for f in files):
            return None
        self.check_config(cfg, what=f"a {meta['status']} run of a different configuration")
        return meta

    def start(self) -> None:
        """The training begins (a resumed run says ``running`` again)."""
        if self.resume and self.writer and not self.started:
            update_run(self.out, status="running")
        self.started = True

    def update(self, **fields: Any) -> None:
        """Change ``fields`` of ``run.json`` (rank 0; atomically)."""
        if self.writer:
            update_run(self.out, **fields)

    def finish(self, status: str, **fields: Any) -> None:
        """Record the run's last status (one of :data:`STATUSES`) and ``fields``."""
        if status not in STATUSES:
            raise ValueError(f"status={status!r}; allowed: {', '.join(STATUSES)}")
        self.update(status=status, **fields)

    def _record_end(self, exc: BaseException) -> None:
        """An exception left the run: say so in ``run.json`` (best effort: e.g. the disk is full)."""
        if not (self.started and self.writer):
            return
        interrupted = isinstance(exc, KeyboardInterrupt)
        line = (str(exc).splitlines() or [type(exc).__name__])[0]
        try:
            if read_run(self.out).get("status") == "running":
                update_run(self.out, status="interrupted" if interrupted else "failed",
                           **({} if interrupted else {"error": f"{type(exc).__name__}: {line}"}))
        except (OSError, RunError):
            pass


@contextlib.contextmanager
def open_run(out: str | Path, *, resume: bool, writer: bool = True,
             error: type[Exception] = RunError) -> Iterator[RunFolder]:
    """The :class:`RunFolder` of ``out``: checked (and locked when resuming) on entry; on leaving,
    an escaping exception recorded (after the start) and the lock released — whatever happened.

    Args:
        out: the run folder.
        resume: continue the run in ``out`` (else ``out`` must be free).
        writer: this process writes the folder (rank 0 of a torchrun world).
        error: the exception class of a refused folder (e.g. the embeddings package's own).

    Raises:
        RunError (or ``error``): ``out`` cannot hold a new run / holds no run / is in use.
    """
    run = RunFolder(out, resume=resume, writer=writer, error=error)
    try:
        if writer:
            check_out_dir(run.out, resume=resume, error=error)
            if resume:
                acquire(run.out)
        yield run
    except BaseException as e:
        run._record_end(e)
        raise
    finally:
        if writer:
            release(run.out)


@contextlib.contextmanager
def run_session(device: str, out: str | Path, *, resume: bool,
                error: type[Exception] = RunError) -> Iterator[tuple[qdist.DistInfo, RunFolder]]:
    """``(dist info, run folder)`` of one run: processes set up (``torchrun`` or one), the folder
    opened (:func:`open_run`, by rank 0), and on leaving both torn down — whatever happened."""
    info = qdist.setup(device)
    try:
        with open_run(out, resume=resume, writer=info.is_main, error=error) as run:
            yield info, run
    finally:
        qdist.teardown()


def check_resume_data(run: RunFolder, cfg, sha256: str, *, what: str = "data", same: str = "data",
                      detail: str = "", error: type[Exception] | None = None) -> None:
    """``--resume``: refuse ``cfg`` unless it is the stored configuration (:meth:`RunFolder.check_config`)
    and the data's ``sha256`` the ``data_sha256`` of ``run.json``.

    Args:
        run: the resumed run's folder.
        cfg: the run's configuration.
        sha256: the data's fingerprint now.
        what: the data's name in the message (``data``, ``images``, ``canvases``).
        same: what to resume with, in the message's fix (``data``, ``files``).
        detail: said after "was started with" (e.g. `` (their sha256 does not match run.json)``).
        error: the exception class of other data (default: the folder's, :class:`RunError`).

    Raises:
        RunError (or ``error``): the configuration or the data differ.
    """
    run.check_config(cfg)
    if run.meta().get("data_sha256") != sha256:
        raise (error or run.error)(f"--resume: the {what} differ from those {run.out} was started with{detail}; "
                                   f"resume with the same {same}, or start a new run")


def resume_eval(state: dict) -> dict | None:
    """The last held-out evaluation a checkpoint's trainer state carries (``None`` if none)."""
    ev = state.get("last_eval") if isinstance(state, dict) else None
    return ev if isinstance(ev, dict) else None
