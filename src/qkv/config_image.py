"""What a model's input images are and how they become a sequence of patches: :class:`ImageConfig`.

An image model (a Vision Transformer, Dosovitskiy et al. 2021) cuts each ``channels × H × W`` image
(or ``channels × L`` signal) into patches of ``patch`` pixels taken every ``stride`` pixels (``stride
= patch``: side by side; smaller: overlapping), maps each flattened patch to a vector of the model
width, and puts a learned [CLS] vector in front when ``cls_token`` is set. ``stem`` puts a
convolutional stem before the patches (the ViT paper's hybrid, §3.1; Xiao et al. 2021, "Early
convolutions help transformers see better"): 3-wide (3×3) convolutions, stride 1 and zero padding
so that the image keeps its size, each followed by GELU, with the given output channels; the
patches are then cut from the stem's feature maps, the same cells of the image as without it (each
patch now sees one pixel more on every side per convolution). The patches form a grid
of ``(H − p_h) / s_h + 1`` rows by ``(W − p_w) / s_w + 1`` columns, read row by row. A patch/stride
that does not tile the image exactly is refused: no pixel is ever dropped silently.

``position`` names the patches' position scheme (:mod:`qkv.nn.positional`: ``learned``,
``sinusoidal-2d``, ``rope-2d``, ``none``, or any 1-D scheme over the patches in reading order); the
other position settings (rotary base, relative distances) come from ``ModelConfig.positions``,
whose ``scheme`` is the text side's (a captioner's decoder).

Plain values only; this module imports nothing of qkv's models or modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from qkv.validation import check_bool, check_int

__all__ = ["ImageConfig"]


def _dims(name: str, value: Any, n: int | None) -> tuple[int, ...]:
    """``value`` as a tuple of positive ints (an int is repeated ``n`` times)."""
    if isinstance(value, int) and not isinstance(value, bool) and n is not None:
        value = (value,) * n
    if isinstance(value, list):
        value = tuple(value)
    if (not isinstance(value, tuple) or not value or len(value) > 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise ValueError(f"image.{name}={value!r} must be one or two positive ints (height, width) or (length,)")
    if n is not None and len(value) != n:
        raise ValueError(f"image.{name}={value!r} has {len(value)} dimension(s) but image.size has {n}")
    return value


@dataclass(frozen=True)
class ImageConfig:
    """The images a model reads and its patch embedding.

    Attributes:
        size: ``(H, W)`` of an image, or ``(L,)`` of a 1-D signal (MNIST-1D).
        channels: input channels (1 grey, 3 colour).
        patch: patch size per axis (an int: the same on every axis).
        stride: step between patches per axis; ``None`` = ``patch`` (patches side by side).
        cls_token: put a learned [CLS] vector before the patches (ViT's; needed to pool with ``cls``).
        position: the patches' position scheme (see the module docstring).
        stem: output channels of each convolution of a convolutional stem (``()``: none).
    """

    size: tuple[int, ...] = (28, 28)
    channels: int = 1
    patch: tuple[int, ...] | int = (4, 4)
    stride: tuple[int, ...] | int | None = None
    cls_token: bool = True
    position: str = "learned"
    stem: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        size = _dims("size", self.size, None)
        patch = _dims("patch", self.patch, len(size))
        stride = patch if self.stride is None else _dims("stride", self.stride, len(size))
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "patch", patch)
        object.__setattr__(self, "stride", None if self.stride is None else stride)
        check_int("image.channels", self.channels)
        check_bool("image.cls_token", self.cls_token)
        stem = tuple(self.stem) if isinstance(self.stem, list) else self.stem
        if (not isinstance(stem, tuple) or len(stem) > 4
                or not all(isinstance(c, int) and not isinstance(c, bool) and 0 < c <= 1024 for c in stem)):
            raise ValueError(f"image.stem={self.stem!r} must be a list of at most 4 channel counts (ints 1-1024), one "
                             "per 3×3 convolution before the patches, e.g. [16, 16]; [] for none")
        object.__setattr__(self, "stem", stem)
        if not isinstance(self.position, str) or not self.position:
            raise ValueError(f"image.position={self.position!r} must be a position scheme's name")
        shown = "×".join(map(str, size))
        for axis, (s, p, st) in enumerate(zip(size, patch, stride)):
            if p > s:
                raise ValueError(f"image.patch={patch} is larger than the {shown} image; choose a patch of at most "
                                 f"{s} pixels on axis {axis}")
            if (s - p) % st:
                raise ValueError(f"a patch of {p} every {st} pixels does not tile the {s} pixels of axis {axis} of a "
                                 f"{shown} image ((size − patch) % stride = {(s - p) % st} pixels would be left "
                                 f"out); choose a patch and stride with (size − patch) divisible by stride, e.g. "
                                 f"patch={_divisor(s, p)}")

    @property
    def strides(self) -> tuple[int, ...]:
        """The stride per axis (``patch`` when ``stride`` is ``None``)."""
        return self.patch if self.stride is None else self.stride

    @property
    def grid(self) -> tuple[int, ...]:
        """Patches per axis: ``(rows, columns)`` or ``(n,)``."""
        return tuple((s - p) // st + 1 for s, p, st in zip(self.size, self.patch, self.strides))

    @property
    def n_patches(self) -> int:
        return math.prod(self.grid)

    @property
    def prefix(self) -> int:
        """Tokens before the patches: 1 with a [CLS] token, else 0."""
        return int(self.cls_token)

    @property
    def n_tokens(self) -> int:
        """The encoder's sequence length: the patches and the [CLS] token."""
        return self.n_patches + self.prefix

    @property
    def features(self) -> int:
        """Channels the patches are cut from: the stem's last convolution's, else the image's."""
        return self.stem[-1] if self.stem else self.channels

    @property
    def patch_dim(self) -> int:
        """Values in one flattened patch: ``features · ∏ patch``."""
        return self.features * math.prod(self.patch)

    def to_dict(self) -> dict[str, Any]:
        return {"size": list(self.size), "channels": self.channels, "patch": list(self.patch),
                "stride": None if self.stride is None else list(self.stride), "cls_token": self.cls_token,
                "position": self.position, "stem": list(self.stem)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImageConfig:
        """Build from a ``dict``; unknown keys are an error naming them and the allowed ones."""
        if not isinstance(data, dict):
            raise ValueError(f"image must be a JSON object, got {type(data).__name__}")
        allowed = ("size", "channels", "patch", "stride", "cls_token", "position", "stem")
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise ValueError(f"unknown image field(s) {unknown}; allowed: {', '.join(allowed)}")
        return cls(**data)


def _divisor(size: int, patch: int) -> int:
    """A patch near ``patch`` that divides ``size`` (for the message)."""
    return min((d for d in range(1, size + 1) if size % d == 0), key=lambda d: (abs(d - patch), d))
