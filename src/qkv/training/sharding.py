"""Fully sharded data parallelism (FSDP2) for the training engine: PyTorch's ``fully_shard`` on an
explicit device mesh — gloo on CPU, NCCL on CUDA.

    shard_model(model, info)      every transformer layer a group, then the root (embeddings, heads)
    gathered(model)               evaluation on the gathered weights: any number of forward passes
    full_state_dict(model)        the whole model on rank 0 (CPU tensors), e.g. for the final folder
    plain_model(model, state)     rank 0: the same kind of qkv model, unsharded, holding ``state``

Each process keeps 1/K of every parameter, gradient and AdamW moment (K processes); a layer's
weights are all-gathered for its forward and backward and freed after them, its gradients
reduce-scattered (averaged over the ranks, as DDP averages them). The numbers are those of DDP up to
float rounding (the sum of the gradients is taken in another order).

Evaluation runs on the gathered weights: objectives evaluate with as many forward passes as their
held-out share needs (a rank may have one batch fewer; generation stops when its sequences end), so
every group is gathered once before and freed after (1× the parameters per process — training holds
parameters, gradients and two AdamW moments, 4×, sharded).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from qkv.errors import QkvError
from qkv.models.kinds import build_kind, model_kind
from qkv.nn.decoder_layer import DecoderLayer
from qkv.nn.layer import TransformerLayer
from qkv.training.distributed import DistInfo

__all__ = ["shard_model", "is_sharded", "gathered", "full_state_dict", "plain_model", "gradient_sync",
           "local_value", "SHARD_UNITS"]

#: The modules that become one FSDP group each (the rest of the model is the root's group).
SHARD_UNITS = (TransformerLayer, DecoderLayer)


def shard_model(model: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    """Shard ``model`` in place over all ``info.world_size`` processes; returns it (an FSDP module).

    Each :data:`SHARD_UNITS` module is a group whose weights are freed after its forward pass; the
    root group (embeddings, final norm, heads, tied output map) stays gathered between forward and
    backward.

    Raises:
        QkvError: ``model`` is not a qkv model (the final model folder is written through its kind).
    """
    try:
        model_kind(model)
    except ValueError as e:
        raise QkvError(f"--strategy fsdp trains qkv models only ({e}); use --strategy ddp") from None
    mesh = init_device_mesh(info.device.type, (info.world_size,))
    for m in list(model.modules()):
        if isinstance(m, SHARD_UNITS):
            fully_shard(m, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` was sharded by :func:`shard_model` (``fully_shard``)."""
    return isinstance(model, FSDPModule)


def _groups(model: torch.nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block every group of a sharded ``model`` holds its whole weights, so that each
    rank may run any number of forward passes without the others (a collective on entry and on
    exit, on every rank). A no-op for a model that is not sharded."""
    groups = _groups(model)
    if not groups:
        yield
        return
    for g in groups:
        g.unshard()
        g.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for g in groups:
            g.set_reshard_after_forward(g is not model, recurse=False)  # as shard_model set them
            g.reshard()


def gradient_sync(model: torch.nn.Module, enabled: bool) -> None:
    """Reduce gradients in the next backward pass (``enabled``) or accumulate them locally (the
    micro-batches of a step before its last)."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole state of a sharded ``model`` as CPU tensors on rank 0 (``{}`` on the others) — a
    collective: every rank calls it."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def plain_model(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A model of the kind of ``model`` (built by :func:`qkv.models.kinds.build_kind`), unsharded,
    on the CPU, holding ``state`` (what :func:`full_state_dict` gave rank 0)."""
    config, kind, task = model_kind(model)
    causal = kind == "encoder" and bool(getattr(model, "causal", False))
    plain = build_kind(config, kind, task, causal=causal)
    missing, unexpected = plain.load_state_dict(state, strict=False)
    tied = {n for n, _ in plain.named_parameters(remove_duplicate=False)} - {n for n, _ in plain.named_parameters()}
    if unexpected or set(missing) - tied:
        raise QkvError(f"the gathered weights do not fit a new {kind}: missing {sorted(set(missing) - tied)[:5]}, "
                       f"unexpected {sorted(unexpected)[:5]}")
    return plain.train(model.training)


def local_value(t: torch.Tensor) -> torch.Tensor:
    """``t`` as an ordinary tensor: a ``DTensor`` (e.g. the gradient norm of sharded gradients)
    gathered, anything else as it is."""
    return t.full_tensor() if isinstance(t, DTensor) else t
