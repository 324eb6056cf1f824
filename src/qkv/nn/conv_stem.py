"""A convolutional stem before an image model's patches: ``x ← GELU(conv₃(x))`` per convolution.

Legend: B batch, K input channels, (R, W) image height and width (L: a signal's length), K' a
convolution's output channels.

The ViT paper's hybrid (Dosovitskiy et al. 2021, §3.1) feeds the transformer patches of a CNN's
feature maps instead of raw pixels; Xiao et al. (2021, "Early convolutions help transformers see
better") show that a few small convolutions in place of the raw patch cut make a ViT train faster
and more robustly. This stem is the smallest form of that: 3×3 convolutions (3-wide for 1-D
signals), stride 1, one pixel of zero padding so that the image keeps its size, each followed by
GELU. The patches are then cut from the last feature maps at the same cells as from the image.
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["ConvStem"]


class ConvStem(nn.Module):
    """Convolutions ``K → widths[0] → … → widths[-1]``, each 3 wide, stride 1, padding 1, then GELU.

    Args:
        channels: K. widths: each convolution's output channels. dims: 2 for images, 1 for signals.
    """

    def __init__(self, channels: int, widths: tuple[int, ...], dims: int = 2):
        super().__init__()
        if not widths or dims not in (1, 2):
            raise ValueError(f"a stem needs at least one convolution and 1 or 2 dimensions, got {widths!r}, {dims}")
        conv = nn.Conv2d if dims == 2 else nn.Conv1d
        layers: list[nn.Module] = []
        for k_in, k_out in zip((channels, *widths[:-1]), widths):
            layers += [conv(k_in, k_out, 3, padding=1), nn.GELU()]
        self.layers = nn.Sequential(*layers)
        self.widths = tuple(widths)

    def forward(self, x: Tensor) -> Tensor:
        """``(B,K,R,W)`` → ``(B,K',R,W)`` (or ``(B,K,L)`` → ``(B,K',L)``)."""
        return self.layers(x)

    def extra_repr(self) -> str:
        return f"widths={self.widths}"
