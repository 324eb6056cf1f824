"""The run folder: created atomically, identified by ``run.json``, refused when it holds another run.

    run.json              train config, model config, tokenizer fingerprint, data summary, status
    tokenizer.json        the tokenizer (Hugging Face form)
    metrics.jsonl         one JSON object per logged step and per evaluation
    curve.png             training/held-out loss and held-out accuracy
    checkpoints/          see :mod:`qkv.training.checkpoint`
    qkv.json, model.safetensors   the final model (``qkv.load(run_folder)`` loads it)

A new run folder is assembled under a temporary name next to its destination and renamed into
place only once ``run.json`` and the tokenizer are written, so a run that fails before training
never leaves a folder that ``--resume`` could mistake for a good one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from qkv.training.checkpoint import atomic_write_text

__all__ = ["RunError", "check_out_dir", "create_run_dir", "read_run", "update_run", "truncate_metrics"]

RUN_JSON = "run.json"


class RunError(ValueError):
    """A run folder problem the user must fix (the message says how)."""


def check_out_dir(out: Path, *, resume: bool) -> None:
    """Fail early when ``out`` cannot hold this run."""
    out = Path(out)
    if resume:
        if not (out / RUN_JSON).is_file():
            raise RunError(f"--resume: {out} holds no run ({RUN_JSON} missing); start it without --resume")
        return
    if out.exists():
        if (out / RUN_JSON).is_file():
            raise RunError(f"{out} already holds a run; continue it with --resume or choose another --out")
        if not out.is_dir() or any(out.iterdir()):
            raise RunError(f"{out} exists and is not an empty folder; choose another --out")
    parent = out.parent if not out.exists() else out
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise RunError(f"cannot create the run folder {out}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise RunError(f"cannot write the run folder {out}: {probe} is not writable")


def create_run_dir(out: Path, meta: dict[str, Any], tokenizer) -> Path:
    """Create ``out`` with ``run.json`` and ``tokenizer.json``, atomically."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tokenizer.save(tmp)
        (tmp / RUN_JSON).write_text(json.dumps(meta, indent=2), encoding="utf-8")
        if out.exists():  # an empty folder (checked before)
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_run(out: Path) -> dict[str, Any]:
    try:
        return json.loads((Path(out) / RUN_JSON).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise RunError(f"cannot read {Path(out) / RUN_JSON}: {e}") from e


def update_run(out: Path, **fields: Any) -> None:
    meta = read_run(out)
    meta.update(fields)
    atomic_write_text(Path(out) / RUN_JSON, json.dumps(meta, indent=2))


def truncate_metrics(out: Path, step: int) -> None:
    """Keep only the metrics of steps ≤ ``step`` (those the resumed run will not log again)."""
    path = Path(out) / "metrics.jsonl"
    if not path.is_file():
        return
    keep = [line for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step]
    atomic_write_text(path, "".join(line + "\n" for line in keep))
