"""The run folder: created atomically, identified by ``run.json``, refused when it holds another run.

    run.json              train config, model config, tokenizer fingerprint, data summary, status
    tokenizer.json        the tokenizer (Hugging Face form)
    metrics.jsonl         one JSON object per logged step and per evaluation
    curve.png             training/held-out loss and held-out accuracy
    checkpoints/          see :mod:`qkv.training.checkpoint`
    qkv.json, model.safetensors   the final model (``qkv.load(run_folder)`` loads it)

A new run folder is assembled under a temporary name next to its destination and renamed into
place only once ``run.json`` and the tokenizer are written, so a run that fails before training
never leaves a folder that ``--resume`` could mistake for a good one. The folder is born locked
(``.lock``, :mod:`qkv.training.lock`) by the process that made it, so a second process racing
for the same ``--out`` is refused.

``metrics.jsonl`` is append-only, one whole line per write; a line torn by a crash mid-append
can only be the last one, and :func:`qkv.training.metrics.truncate_metrics` (run on every resume)
drops it.

This module holds the folder's parts (its check, ``run.json``); :mod:`qkv.training.lifecycle` runs a
run's folder from its check to its last status.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from qkv._faults import fault_point
from qkv._fs import atomic_write_text
from qkv.errors import QkvError

__all__ = ["RunError", "RUN_JSON", "check_out_dir", "read_run", "update_run"]

RUN_JSON = "run.json"


class RunError(QkvError):
    """A run folder problem the user must fix (the message says how)."""


def check_out_dir(out: Path, *, resume: bool, error: type[Exception] = RunError) -> None:
    """Fail early when ``out`` cannot hold this run (``error``: the exception class raised)."""
    out = Path(out)
    if resume:
        if not (out / RUN_JSON).is_file():
            raise error(f"--resume: {out} holds no run ({RUN_JSON} missing); start it without --resume")
        return
    if out.exists():
        if (out / RUN_JSON).is_file():
            raise error(f"{out} already holds a run; continue it with --resume or choose another --out")
        if not out.is_dir():
            raise error(f"{out} exists and is not an empty folder (it is not a folder: a file); "
                        "choose another --out")
        if any(out.iterdir()):
            raise error(f"{out} exists and is not an empty folder; choose another --out")
    parent = out.parent if not out.exists() else out
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise error(f"cannot create the run folder {out}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise error(f"cannot write the run folder {out}: {probe} is not writable")


def read_run(out: Path) -> dict[str, Any]:
    """``run.json`` of run folder ``out``, checked to be a qkv run.

    Raises:
        RunError: unreadable, not JSON, or not a run's ``run.json`` (the message names the file).
    """
    path = Path(out) / RUN_JSON
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunError(f"cannot read {path}: {e}; the run folder is damaged") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("train_config"), dict):
        raise RunError(f"{path} is not a qkv run's run.json (no train_config object); the run folder is damaged")
    return meta


def update_run(out: Path, **fields: Any) -> None:
    """Change ``fields`` of ``run.json`` (atomically)."""
    meta = read_run(out)
    meta.update(fields)
    if fields.get("status") == "complete":
        fault_point("finalise.run_json")
    atomic_write_text(Path(out) / RUN_JSON, json.dumps(meta, indent=2))
