"""Sharded training checkpoints through ``torch.distributed.checkpoint`` (DCP): every process writes
its own shard of the weights and of the optimiser state, and any number of processes reads them back.

Layout inside a run folder (beside the whole-model checkpoints of :mod:`qkv.training.checkpoint`)::

    checkpoints/step-00000100/   .metadata · __0_0.distcp · __1_0.distcp … · trainer.json
    checkpoints/LATEST           the name of the newest complete checkpoint folder

The state is the model's and the optimiser's *state dicts by parameter name*
(``torch.distributed.checkpoint.state_dict.get_state_dict``), so a checkpoint saved by K sharded
processes loads into K' sharded processes, or into one unsharded process, whatever K' is: DCP reads
from each file the pieces a process needs.

Written like a whole-model checkpoint: rank 0 makes a temporary folder beside the final one, every
rank writes its shard into it, then rank 0 adds ``trainer.json`` (with ``"format": "sharded"``, the
world size and the sha256 of every file), renames the folder into place and only then points
``LATEST`` at it. A crash at any moment leaves ``LATEST`` naming a complete checkpoint. Every rank
must see the same run folder (one machine, or a file system shared by the nodes).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from qkv._faults import fault_point
from qkv._fs import make_temp_dir, publish_dir, sha256_file
from qkv.errors import CheckpointError
from qkv.training.checkpoint import point_latest, prune_checkpoints, read_trainer_state, verify_checkpoint, write_error
from qkv.training.distributed import DistInfo, all_sum

__all__ = ["SHARDED", "save_sharded_checkpoint", "load_sharded_checkpoint", "is_sharded_checkpoint"]

#: ``trainer.json``'s ``format`` of a sharded checkpoint.
SHARDED = "sharded"


def is_sharded_checkpoint(state: dict) -> bool:
    """Whether a checkpoint's trainer state (``trainer.json``) is that of a sharded checkpoint."""
    return state.get("format") == SHARDED


def _shared_path(path: Path | None, info: DistInfo) -> Path:
    """Rank 0's ``path``, on every rank."""
    if not info.distributed:
        return path
    box = [str(path) if info.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return Path(box[0])


@contextlib.contextmanager
def _quiet_dcp() -> Iterator[None]:
    """One process without a process group: DCP warns that it assumes one process (it is meant)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_sharded_checkpoint(run_dir: Path, *, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                            scheduler: Any, trainer_state: dict | None, info: DistInfo, keep: int = 2) -> Path:
    """Write sharded checkpoint ``step`` (every rank calls it; rank 0 passes ``trainer_state``).

    Returns:
        The checkpoint folder.

    Raises:
        CheckpointWriteError: on every rank, when any rank's write failed (the previous checkpoint
            and ``LATEST`` are intact).
    """
    root = Path(run_dir) / "checkpoints"
    name = f"step-{step:08d}"
    final = root / name
    tmp = None
    if info.is_main:
        root.mkdir(parents=True, exist_ok=True)
        tmp = make_temp_dir(final)
    tmp = _shared_path(tmp, info)
    failure: BaseException | None = None
    try:
        msd, osd = get_state_dict(model, optimizer)
        with _quiet_dcp():
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=tmp)
        if info.is_main:
            fault_point("checkpoint.write")
            _finish(tmp, final, step, scheduler, trainer_state, info)
            point_latest(root, name)
    except (OSError, CheckpointException) as e:
        failure = e
    failed = all_sum(torch.tensor(0.0 if failure is None else 1.0)).item() > 0
    if failed:
        if info.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(run_dir, final, failure or OSError("another rank could not write its shard")) from failure
    if info.is_main:
        prune_checkpoints(root, name, keep)
    return final


def _finish(tmp: Path, final: Path, step: int, scheduler: Any, trainer_state: dict, info: DistInfo) -> None:
    """Rank 0, once every shard is in ``tmp``: ``trainer.json``, then the folder renamed into place."""
    files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    state = dict(trainer_state, step=step, scheduler=scheduler.state_dict() if scheduler else None, files=files,
                 format=SHARDED, world_size=info.world_size)
    (tmp / "trainer.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
    publish_dir(tmp, final, how="replace", sync=True)


def load_sharded_checkpoint(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                            scheduler: Any, run_id: str | None = None, max_step: int | None = None) -> dict:
    """Restore model, optimiser and scheduler from sharded checkpoint ``path`` on any number of
    processes (every rank calls it; sharded or not, ``model`` takes its part); return the trainer state.

    Raises:
        CheckpointError: a missing or changed file, another run's checkpoint, or state that does not
            fit this model (the message names the checkpoint).
    """
    path = Path(path)
    state = read_trainer_state(path)
    files = state.get("files")
    if not is_sharded_checkpoint(state) or not isinstance(files, dict) or ".metadata" not in files:
        raise CheckpointError(f"checkpoint {path}: trainer.json does not describe a sharded checkpoint (no "
                              "format 'sharded' with its files); it cannot be resumed from")
    verify_checkpoint(path, state, run_id=run_id, max_step=max_step, files=tuple(files))
    msd, osd = get_state_dict(model, optimizer)
    sd = {"model": msd, "optim": osd}
    try:
        with _quiet_dcp():
            dcp.load(sd, checkpoint_id=path)
    except (CheckpointException, RuntimeError, ValueError, KeyError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0][:300]
        raise CheckpointError(f"checkpoint {path} does not fit this model and optimiser ({first}); resume "
                              "with the model it was written by") from e
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    if scheduler is not None and state.get("scheduler"):
        try:
            scheduler.load_state_dict(state["scheduler"])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{path / 'trainer.json'}: bad scheduler state ({e})") from e
    return state

