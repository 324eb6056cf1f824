"""Training checkpoints, written atomically and checked when read.

Layout inside a run folder::

    checkpoints/step-00000100/   model.safetensors · optimizer.pt · trainer.json
    checkpoints/LATEST           the name of the newest complete checkpoint folder

A checkpoint folder is written under a temporary name, flushed, then renamed into place; only
then is ``LATEST`` replaced (atomically, :mod:`qkv._fs`). A crash at any moment therefore leaves
``LATEST`` naming a complete checkpoint — never a half-written one. Older checkpoints beyond
``keep`` are removed after the switch; leftovers of an interrupted write are removed by the next.

``trainer.json`` holds the step, the scheduler state, the data position, the run's id, the last
held-out evaluation and the sha256 of ``model.safetensors`` and ``optimizer.pt``; reading a
checkpoint verifies all of them (a truncated, missing or swapped file, a step beyond the run, or
weights of another run are refused with a message naming the file). ``optimizer.pt`` holds only
tensors and plain values and is read with ``torch.load(weights_only=True)``; the model is
safetensors. Every random draw of a training step is seeded from ``(seed, step)``, so no RNG state
needs saving for a bit-identical resume.

A write that fails (disk full, …) raises :class:`CheckpointWriteError` and leaves the previous
checkpoint, and ``LATEST``, untouched.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from qkv._faults import fault_point
from qkv._fs import atomic_write_text, sha256_file, write_folder
from qkv.errors import CheckpointError

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "CheckpointWriteError",
           "read_trainer_state", "verify_checkpoint", "point_latest", "write_error", "prune_checkpoints",
           "LATEST"]

LATEST = "LATEST"
_CHECKED = ("model.safetensors", "optimizer.pt")


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (e.g. disk full); the previous one is intact."""


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
    """Write checkpoint ``step`` atomically and point ``LATEST`` at it. Returns its folder.

    Raises:
        CheckpointWriteError: the write failed (the message says the previous checkpoint is intact).
    """
    root = Path(run_dir) / "checkpoints"
    name = f"step-{step:08d}"
    final = root / name
    try:
        with write_folder(final, sync=True) as tmp:  # replaces a folder of this step as a whole
            save_file(_state_dict_for_saving(model), str(tmp / "model.safetensors"))
            fault_point("checkpoint.write")
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            files = {f: sha256_file(tmp / f) for f in _CHECKED}
            state = dict(trainer_state, step=step, scheduler=scheduler.state_dict() if scheduler else None,
                         files=files)
            (tmp / "trainer.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
        point_latest(root, name)
    except OSError as e:
        raise write_error(run_dir, final, e) from e
    prune_checkpoints(root, name, keep)
    return final


def point_latest(root: Path, name: str) -> None:
    """Make ``root/LATEST`` name the complete checkpoint folder ``name`` (atomically)."""
    fault_point("checkpoint.latest")
    atomic_write_text(root / LATEST, name + "\n")


def write_error(run_dir: Path, final: Path, e: BaseException) -> CheckpointWriteError:
    """The error of a failed write of checkpoint ``final`` (it names the checkpoint that is intact)."""
    try:
        last = latest_checkpoint(run_dir)
    except CheckpointError:
        last = None
    why = getattr(e, "strerror", None) or (str(e).splitlines() or [type(e).__name__])[0]
    return CheckpointWriteError(
        f"could not write checkpoint {final} ({why}); nothing is lost: "
        + (f"the last complete checkpoint {last} is intact" if last else "no checkpoint was written yet")
        + ". Free space (or fix the folder), then continue with --resume")


def prune_checkpoints(root: Path, name: str, keep: int) -> None:
    """Remove the checkpoints older than the ``keep`` newest (``name`` the newest) and the leftovers
    of interrupted writes (one writer: the run's lock)."""
    olds = sorted(p for p in root.glob("step-*") if p.is_dir() and p.name != name)
    for p in olds[: max(0, len(olds) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(".step-*"):
        shutil.rmtree(p, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The folder ``LATEST`` names, or ``None`` when the run has no complete checkpoint.

    Raises:
        CheckpointError: ``LATEST`` names no complete checkpoint folder.
    """
    root = Path(run_dir) / "checkpoints"
    try:
        name = (root / LATEST).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"cannot read {root / LATEST}: {e}") from e
    path = root / name
    if not name.startswith("step-") or "/" in name or not (path / "trainer.json").is_file():
        raise CheckpointError(f"{root / LATEST} names {name!r}, but {path} is not a complete checkpoint; "
                              f"write the name of a complete step-* folder into it, or start a new run")
    return path


def read_trainer_state(path: Path) -> dict:
    """``trainer.json`` of checkpoint folder ``path``, checked to be a JSON object with a step.

    Raises:
        CheckpointError: unreadable, not an object, or no integer step.
    """
    f = Path(path) / "trainer.json"
    try:
        state = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{f}: not readable JSON ({e}); the checkpoint is damaged") from e
    if not isinstance(state, dict) or not isinstance(state.get("step"), int) or isinstance(state["step"], bool):
        raise CheckpointError(f"{f}: expected a JSON object with an integer 'step'; the checkpoint is damaged")
    return state


def verify_checkpoint(path: Path, state: dict, *, run_id: str | None, max_step: int | None,
                      files: tuple[str, ...] = _CHECKED) -> None:
    """Refuse checkpoint folder ``path`` (its ``trainer.json`` read as ``state``) when its step does
    not fit, it belongs to another run, or one of ``files`` is missing or differs from its sha256.

    Raises:
        CheckpointError: naming the file and how to go on.
    """
    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path}: {why}. It cannot be resumed from; point "
                               f"{path.parent / LATEST} at an older complete step-* folder, or start a new run")

    step = state["step"]
    if path.name.startswith("step-") and path.name[5:].isdigit() and int(path.name[5:]) != step:
        raise bad(f"trainer.json says step {step}, the folder is {path.name}")
    if step < 0 or (max_step is not None and step > max_step):
        raise bad(f"trainer.json says step {step}, beyond this run's {max_step} steps")
    if run_id is not None and state.get("run_id") not in (None, run_id):
        raise bad(f"it belongs to another run (run id {str(state.get('run_id'))[:12]}, this run's is "
                  f"{run_id[:12]})")
    sums = state.get("files")
    for name in files:
        if not (path / name).is_file():
            raise bad(f"{name} is missing")
    if isinstance(sums, dict):
        for name in files:
            if name in sums and sha256_file(path / name) != sums[name]:
                raise bad(f"{name} differs from the file written at save time (truncated, damaged or "
                          "replaced: its sha256 does not match trainer.json)")


def load_checkpoint(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, run_id: str | None = None, max_step: int | None = None) -> dict:
    """Restore model, optimiser and scheduler from checkpoint folder ``path``; return trainer state.

    Args:
        path: a ``step-*`` folder.
        model, optimizer, scheduler: restored in place.
        run_id: the run's id; a checkpoint of another run is refused.
        max_step: the run's steps; a checkpoint claiming a later step is refused.

    Raises:
        CheckpointError: a missing, truncated, replaced or misfitting file (the message names it).
    """
    path = Path(path)
    state = read_trainer_state(path)
    verify_checkpoint(path, state, run_id=run_id, max_step=max_step)
    try:
        weights = load_file(str(path / "model.safetensors"))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path / 'model.safetensors'}: not a readable safetensors file ({e})") from e
    expected = _state_dict_for_saving(model)
    if set(weights) != set(expected):
        raise CheckpointError(
            f"checkpoint {path} does not fit the model: missing {sorted(set(expected) - set(weights))[:5]}, "
            f"unexpected {sorted(set(weights) - set(expected))[:5]}"
        )
    for name, t in expected.items():
        if tuple(weights[name].shape) != tuple(t.shape):
            raise CheckpointError(f"checkpoint {path}: tensor {name!r} has shape {tuple(weights[name].shape)}, "
                                  f"the model's is {tuple(t.shape)} (another vocabulary size or model?)")
    model.load_state_dict(weights, strict=False)  # aliases of tied tensors are filled through the tie
    try:
        opt_state = torch.load(path / "optimizer.pt", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, AttributeError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{path / 'optimizer.pt'}: refused — not a plain tensor file (damaged, or a "
                              f"pickle that would run code, which qkv never loads): {first}") from e
    try:
        optimizer.load_state_dict(opt_state)
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"{path / 'optimizer.pt'}: does not fit this model's optimiser ({e})") from e
    if scheduler is not None and state.get("scheduler"):
        try:
            scheduler.load_state_dict(state["scheduler"])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{path / 'trainer.json'}: bad scheduler state ({e})") from e
    return state
