"""Attention over an image: each head's weights from a chosen token to the patches laid on the grid,
attention rollout, and each head's mean attention distance (Dosovitskiy et al. 2021, Fig. 7).

Legend: B images, L layers, H heads, T tokens (P prefix + N patches), A grid axes.

* :func:`image_attentions` — every layer's exact ``(H,T,T)`` weights for a batch of images, read
  from the model's output (``output_attentions``).
* :func:`to_grid` — one query's weights over the patches, shaped as the grid.
* :func:`rollout` — attention rollout (Abnar & Zuidema 2020): per layer the heads' mean with the
  residual connection added, ``Â = ½(mean_h A) + ½ I``, rows renormalised, multiplied from the first
  layer up: ``R = Â_L ⋯ Â_1``. Row ``i`` of R says how much of token i's final state flows from each
  input token. (A private helper: qkv's analysis has no rollout of its own yet.)
* :func:`mean_attention_distance` — for each head, the distance in pixels between a query patch's
  centre and the key patches' centres, weighted by the attention (renormalised over the patches:
  the weight on [CLS] is left out), averaged over query patches and images. The ViT paper's
  figure plots it against depth: lower layers mix heads that look locally and heads that look
  globally, higher layers are global.
"""

from __future__ import annotations

import numpy as np
import torch

from qkv.config_image import ImageConfig
from qkv.nn.positional_2d import grid_coordinates
from qkv.nn.vision_encoder import VisionEncoder

__all__ = ["image_attentions", "to_grid", "rollout", "patch_centres", "mean_attention_distance", "encoder_of_image"]


def encoder_of_image(model):
    """The :class:`~qkv.nn.vision_encoder.VisionEncoder` of an image model (itself or its ``encoder``)."""
    enc = model if isinstance(model, VisionEncoder) else getattr(model, "encoder", None)
    if not isinstance(enc, VisionEncoder):
        raise ValueError(f"{type(model).__name__} is not an image model (no VisionEncoder); give a model trained with "
                         "qkv pretrain --objective image, or a converted ViT")
    return enc


@torch.no_grad()
def image_attentions(model, pixel_values: torch.Tensor) -> np.ndarray:
    """``(B,K,…)`` pixel values → ``(B,L,H,T,T)`` float32 exact attention weights of the image encoder."""
    enc = encoder_of_image(model)
    was = enc.training
    enc.eval()
    out = enc(pixel_values, output_attentions=True)
    enc.train(was)
    return torch.stack([a.float() for a in out.attentions], dim=1).numpy()  # L × (B,H,T,T) -> (B,L,H,T,T)


def to_grid(weights: np.ndarray, image: ImageConfig) -> np.ndarray:
    """``(…,T)`` weights of one query over all tokens → ``(…,*grid)`` its weights on the patches."""
    return weights[..., image.prefix:].reshape(*weights.shape[:-1], *image.grid)


def rollout(attentions: np.ndarray) -> np.ndarray:
    """``(L,H,T,T)`` → ``(T,T)`` attention rollout (see the module docstring)."""
    L, _, T, _ = attentions.shape
    out = np.eye(T)
    for layer in range(L):
        a = 0.5 * attentions[layer].mean(axis=0) + 0.5 * np.eye(T)  # (T,T) heads' mean + residual
        a = a / a.sum(axis=-1, keepdims=True)
        out = a @ out  # the later layer on the left: R = Â_l ⋯ Â_1
    return out


def patch_centres(image: ImageConfig) -> np.ndarray:
    """``(N,A)`` each patch's centre in pixels (row, column; or sample)."""
    coords = grid_coordinates(image.grid).numpy().astype(np.float64)  # (N,A)
    return coords * np.array(image.strides) + (np.array(image.patch) - 1) / 2


def mean_attention_distance(attentions: np.ndarray, image: ImageConfig) -> np.ndarray:
    """``(B,L,H,T,T)`` weights → ``(L,H)`` mean attention distance in pixels (see the module docstring)."""
    centres = patch_centres(image)  # (N,A)
    dist = np.sqrt(((centres[:, None, :] - centres[None, :, :]) ** 2).sum(-1))  # (N,N)
    p = image.prefix
    w = attentions[..., p:, p:].astype(np.float64)  # (B,L,H,N,N) patch queries over patch keys
    w = w / np.maximum(w.sum(-1, keepdims=True), 1e-12)
    per_query = (w * dist).sum(-1)  # (B,L,H,N)
    return per_query.mean(axis=(0, 3))  # (L,H)
