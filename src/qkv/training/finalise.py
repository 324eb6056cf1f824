"""Finalisation is idempotent: a finished run stays finished, a half-finished one is finished again.

A run ends with its last held-out evaluation, the final checkpoint (whose ``trainer.json`` keeps
that evaluation as ``last_eval``), the final model in the run folder, and last ``run.json`` with
``status: complete`` and ``final_eval``. A crash anywhere in between leaves the final checkpoint;
``--resume`` then repeats the remaining parts from it, and ``final_eval`` comes back from
``last_eval`` (or, for a checkpoint without it, from evaluating its weights again — the evaluation
is deterministic). ``--resume`` of a run that is complete changes nothing and returns its result.
"""

from __future__ import annotations

from pathlib import Path

from qkv.training.rundir import RunError, read_run

__all__ = ["finished_result", "resume_eval"]


def finished_result(out: Path, cfg):
    """The :class:`~qkv.training.engine.TrainResult` of a complete run in ``out``, else ``None``.
    ``cfg``: the run's configuration (a ``TrainConfig`` or ``FinetuneConfig``).

    Raises:
        RunError: the run is complete but ``cfg`` differs from its configuration.
    """
    from qkv.training.engine import TrainResult

    meta = read_run(out)
    if meta.get("status") != "complete" or not isinstance(meta.get("final_eval"), dict):
        return None
    if not all((Path(out) / f).is_file() for f in ("qkv.json", "model.safetensors")):
        return None
    stored = type(cfg).from_dict({**meta["train_config"], "out": cfg.out})
    diff = stored.diff(cfg)
    if diff:
        raise RunError(f"--resume: {out} is a complete run of a different configuration:\n  " + "\n  ".join(diff))
    return TrainResult(Path(out), int(meta.get("steps_done", stored.steps)), "complete",
                       meta["final_eval"], None)


def resume_eval(state: dict) -> dict | None:
    """The last held-out evaluation a checkpoint's trainer state carries (``None`` if none)."""
    ev = state.get("last_eval") if isinstance(state, dict) else None
    return ev if isinstance(ev, dict) else None
