"""Training checkpoints, written atomically.

Layout inside a run folder::

    checkpoints/step-00000100/   model.safetensors · optimizer.pt · trainer.json
    checkpoints/LATEST           the name of the newest complete checkpoint folder

A checkpoint folder is written under a temporary name, flushed, then renamed into place; only
then is ``LATEST`` replaced (temp file + ``os.replace``). A crash at any moment therefore leaves
``LATEST`` naming a complete checkpoint — never a half-written one. Older checkpoints beyond
``keep`` are removed after the switch.

``optimizer.pt`` holds only tensors and plain values and is read with
``torch.load(weights_only=True)``; the model is safetensors; ``trainer.json`` holds the step, the
scheduler state and the data position. Every random draw of a training step is seeded from
``(seed, step)``, so no RNG state needs saving for a bit-identical resume.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "atomic_write_text"]

LATEST = "LATEST"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _state_dict_for_saving(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # safetensors refuses shared storage (the tied decoder): keep the first name of each tensor.
    out, seen = {}, {}
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:
            continue
        seen[key] = name
        out[name] = t.detach().contiguous().cpu()
    return out


def save_checkpoint(run_dir: Path, *, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler: Any, trainer_state: dict,
                    keep: int = 2) -> Path:
    """Write checkpoint ``step`` atomically and point ``LATEST`` at it. Returns its folder."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:08d}"
    final = root / name
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        save_file(_state_dict_for_saving(model), str(tmp / "model.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        state = dict(trainer_state, step=step, scheduler=scheduler.state_dict() if scheduler else None)
        (tmp / "trainer.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(root / LATEST, name + "\n")
    olds = sorted(p for p in root.glob("step-*") if p.is_dir() and p.name != name)
    for p in olds[: max(0, len(olds) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(".step-*"):  # leftovers of an interrupted write
        shutil.rmtree(p, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The folder ``LATEST`` names, or ``None`` when the run has no complete checkpoint."""
    root = Path(run_dir) / "checkpoints"
    try:
        name = (root / LATEST).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    path = root / name
    if not (path / "trainer.json").is_file():
        raise ValueError(f"{root / LATEST} names {name!r}, but {path} is not a complete checkpoint")
    return path


def load_checkpoint(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any) -> dict:
    """Restore model, optimiser and scheduler from checkpoint folder ``path``; return trainer state."""
    path = Path(path)
    weights = load_file(str(path / "model.safetensors"))
    expected = set(_state_dict_for_saving(model))
    if set(weights) != expected:
        raise ValueError(
            f"checkpoint {path} does not fit the model: missing {sorted(expected - set(weights))}, "
            f"unexpected {sorted(set(weights) - expected)}"
        )
    model.load_state_dict(weights, strict=False)  # aliases of tied tensors are filled through the tie
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    state = json.loads((path / "trainer.json").read_text(encoding="utf-8"))
    if scheduler is not None and state.get("scheduler"):
        scheduler.load_state_dict(state["scheduler"])
    return state
