"""Will a model fit? Its size counted before a byte is allocated, against the memory this machine has.

A model is built once on PyTorch's ``meta`` device (shapes only, no storage; a few milliseconds), its
parameters and buffers counted, and the bytes a run needs compared with the memory the kernel reports
available: absurd sizes (``--max-len 100000000``, ``d_model`` of a hundred million) are refused with one
line naming the largest tensor, instead of an allocator failure deep inside the run.

Legend: P parameters, B buffer elements.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from qkv.errors import QkvError

__all__ = ["Footprint", "ModelTooLargeError", "footprint", "check_fits", "available_memory"]

#: Bytes per parameter: fp32 weights (4) for inference; weights, gradients and AdamW's two moments (16)
#: for training.
BYTES_PER_PARAMETER = {"inference": 4, "training": 16}


class ModelTooLargeError(QkvError):
    """The model's weights (and, for training, gradients and optimiser state) exceed the free memory."""


@dataclass(frozen=True)
class Footprint:
    """``parameters`` P, ``buffers`` B, and the largest tensor's name and shape."""

    parameters: int
    buffers: int
    largest: str
    largest_shape: tuple[int, ...]

    def bytes(self, use: str) -> int:
        return self.parameters * BYTES_PER_PARAMETER[use] + self.buffers * 4


def footprint(build: Callable[[], nn.Module]) -> Footprint:
    """Count the model ``build()`` makes, built on the meta device (no memory is allocated)."""
    with torch.device("meta"):
        model = build()
    tensors = [*model.named_parameters(), *model.named_buffers()]
    name, largest = max(tensors, key=lambda t: t[1].numel(), default=("", torch.empty(0, device="meta")))
    return Footprint(sum(p.numel() for p in model.parameters()), sum(b.numel() for b in model.buffers()),
                     name, tuple(largest.shape))


def available_memory() -> int | None:
    """Bytes the kernel reports available (``MemAvailable``), or ``None`` where it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(build: Callable[[], nn.Module], *, use: str = "training", hint: str = "choose smaller sizes",
               available: int | None = None) -> Footprint:
    """Refuse a model that cannot fit before it is built for real.

    Args:
        build: makes the model (called once, on the meta device).
        use: ``"training"`` (weights, gradients, AdamW state) or ``"inference"`` (weights).
        hint: the fix the message names (the options the user can change).
        available: free bytes (default: :func:`available_memory`; nothing is checked where unknown).

    Raises:
        ModelTooLargeError: the bytes needed exceed ``available``.
    """
    fp = footprint(build)
    free = available_memory() if available is None else available
    need = fp.bytes(use)
    if free is not None and need > free:
        shape = " × ".join(map(str, fp.largest_shape))
        raise ModelTooLargeError(
            f"the model needs {need / 2**30:.1f} GiB for {use} ({fp.parameters:,} parameters; the largest "
            f"tensor is {fp.largest}, {shape}) but this machine has {free / 2**30:.1f} GiB free; {hint}")
    return fp
