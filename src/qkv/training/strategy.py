"""How the engine spreads a run over processes: ``ddp`` (every process holds the whole model;
gradients all-reduced) or ``fsdp`` (every process holds 1/K of the weights, gradients and optimiser
state: :mod:`qkv.training.sharding`). One process is a world of one under either.

What differs between them is here, so that the loop in :mod:`qkv.training.engine` reads the same
for both:

============================  =============================  =======================================
                              ddp                            fsdp
============================  =============================  =======================================
the module the loss runs on   ``DistributedDataParallel``    the model, sharded in place (FSDP2)
micro-batches before the      ``no_sync()``                  ``set_requires_gradient_sync(False)``
last of a step
evaluation                    the model as it is             on the gathered weights
checkpoints                   rank 0: ``model.safetensors``  every rank its shard (DCP,
                              + ``optimizer.pt``             :mod:`qkv.training.sharded_checkpoint`)
resume                        any number of processes        any number of processes (resharded)
the final model folder        rank 0 writes the model        gathered on rank 0, written from an
                                                             unsharded model of the same kind
============================  =============================  =======================================
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from qkv.errors import CheckpointError
from qkv.training.checkpoint import load_checkpoint, read_trainer_state, save_checkpoint
from qkv.training.distributed import STRATEGIES, DistInfo
from qkv.training.sharded_checkpoint import is_sharded_checkpoint, load_sharded_checkpoint, save_sharded_checkpoint
from qkv.training.sharding import full_state_dict, gathered, gradient_sync, plain_model, shard_model

__all__ = ["Strategy", "make_strategy"]


class Strategy:
    """The ``ddp`` strategy (and the base of ``fsdp``): see the module docstring."""

    name = "ddp"
    #: every rank takes part in writing a checkpoint (else rank 0 alone writes it)
    collective_save = False

    def __init__(self, info: DistInfo):
        self.info = info

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the objective's loss runs through (the model itself in a world of one)."""
        if not self.info.distributed:
            return model
        cuda = self.info.device.type == "cuda"
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[self.info.device] if cuda else None)

    def no_sync(self, wrapped: torch.nn.Module) -> contextlib.AbstractContextManager:
        """A block whose backward passes accumulate gradients without reducing them."""
        return wrapped.no_sync() if self.info.distributed else contextlib.nullcontext()

    def evaluating(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The block an objective's ``evaluate`` runs in."""
        return contextlib.nullcontext()

    def save(self, run_dir: Path, *, step: int, model, optimizer, scheduler, trainer_state: dict | None) -> None:
        """Write checkpoint ``step`` (called by rank 0 only, or by every rank when
        :attr:`collective_save`; ``trainer_state`` is ``None`` on ranks other than 0)."""
        save_checkpoint(run_dir, step=step, model=model, optimizer=optimizer, scheduler=scheduler,
                        trainer_state=trainer_state)

    def load(self, path: Path, *, model, optimizer, scheduler, run_id: str | None, max_step: int | None) -> dict:
        """Restore from checkpoint folder ``path`` (its format read from ``trainer.json``)."""
        state = read_trainer_state(path)
        if is_sharded_checkpoint(state):
            return load_sharded_checkpoint(path, model=model, optimizer=optimizer, scheduler=scheduler,
                                           run_id=run_id, max_step=max_step)
        self._whole_model_checkpoint(path)
        return load_checkpoint(path, model=model, optimizer=optimizer, scheduler=scheduler, run_id=run_id,
                               max_step=max_step)

    def _whole_model_checkpoint(self, path: Path) -> None:
        """A whole-model checkpoint is about to be read (the ``fsdp`` strategy refuses it)."""

    def final_model(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """The model to write into the run folder: on rank 0 a model it can save on its own
        (``None`` on the other ranks). Every rank calls it."""
        return model if self.info.is_main else None


class ShardedStrategy(Strategy):
    """``fsdp``: FSDP2 over all processes; sharded checkpoints (in a world of one too)."""

    name = "fsdp"
    collective_save = True

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return shard_model(model, self.info) if self.info.distributed else model

    @contextlib.contextmanager
    def _accumulating(self, wrapped: torch.nn.Module) -> Iterator[None]:
        gradient_sync(wrapped, False)
        try:
            yield
        finally:
            gradient_sync(wrapped, True)

    def no_sync(self, wrapped: torch.nn.Module) -> contextlib.AbstractContextManager:
        return self._accumulating(wrapped)

    def evaluating(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        return gathered(model)

    def save(self, run_dir: Path, *, step: int, model, optimizer, scheduler, trainer_state: dict | None) -> None:
        save_sharded_checkpoint(run_dir, step=step, model=model, optimizer=optimizer, scheduler=scheduler,
                                trainer_state=trainer_state, info=self.info)

    def _whole_model_checkpoint(self, path: Path) -> None:
        raise CheckpointError(f"checkpoint {path} holds the whole model (model.safetensors, optimizer.pt), written "
                              "by a --strategy ddp run; continue it with --strategy ddp")

    def final_model(self, model: torch.nn.Module) -> torch.nn.Module | None:
        if not self.info.distributed:
            return model
        state = full_state_dict(model)  # a collective: every rank
        return plain_model(model, state) if self.info.is_main else None


def make_strategy(name: str, info: DistInfo) -> Strategy:
    """The strategy called ``name`` (one of :data:`~qkv.training.distributed.STRATEGIES`) for ``info``."""
    if name not in STRATEGIES:
        raise ValueError(f"strategy={name!r}; allowed: {', '.join(STRATEGIES)}")
    return ShardedStrategy(info) if name == "fsdp" else Strategy(info)

