"""``qkv analyze`` of an image model: each head's mean attention distance per layer (the ViT paper's
Figure 7, Dosovitskiy et al. 2021) over held-out images.

Legend: B images, L layers, H heads, T tokens.

The images: ``--data`` (``dataset:NAME[:SPLIT]``, or a folder of pictures of the model's size at any
depth, class sub-folders or not), else the held-out set of the run the model was trained in (its
``run.json``: the named data set's test split, its ``--eval-data``, or the same seeded share of its
folder). A seeded sample of ``images`` of them is run through the model in batches.

Written into ``out``: ``attention_distance.json`` (the ``(L,H)`` distances in pixels, the uniform
reference, the images used), ``attention_distance.md`` (the table) and ``attention_distance.png``
(distance against layer, one dot per head, the uniform reference dashed). The uniform reference is
the distance a head spreading its attention evenly over the patches would have; the paper's finding
is that lower layers hold both heads well below it (local) and heads near it (global), upper layers
only global ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from qkv._fs import atomic_write_text
from qkv.analysis import plots
from qkv.analysis.seq2seq_inspect import output_folder
from qkv.data.errors import ImageDataError
from qkv.data.image_datasets import open_images
from qkv.data.images import pixel_values
from qkv.errors import QkvError
from qkv.vision.attention_maps import image_attentions, mean_attention_distance, patch_centres
from qkv.vision.classify import read_image_data
from qkv.vision.config import ImageTrainConfig
from qkv.vision.figures import distance_figure
from qkv.vision.pictures import describe_size, load_image_model, picture_files, read_pictures

__all__ = ["DistanceReport", "attention_distances", "uniform_distance", "held_out_pixels", "run_analyze_images"]


@dataclass
class DistanceReport:
    """Attributes: ``distances`` ``(L,H)`` pixels, ``uniform`` (pixels), ``images`` used, ``source``."""

    distances: np.ndarray
    uniform: float
    images: int
    source: str

    def table(self) -> str:
        """The distances as a Markdown table (layers as rows, heads as columns, from 0)."""
        L, H = self.distances.shape
        lines = ["| Layer | " + " | ".join(f"H{h}" for h in range(H)) + " | mean |",
                 "|---|" + "---|" * (H + 1)]
        for layer in range(L):
            row = self.distances[layer]
            lines.append(f"| L{layer} | " + " | ".join(f"{v:.2f}" for v in row) + f" | {row.mean():.2f} |")
        return "\n".join(lines)


def uniform_distance(image) -> float:
    """The mean attention distance of attention spread evenly over the patches, in pixels."""
    centres = patch_centres(image)  # (N,A)
    return float(np.sqrt(((centres[:, None] - centres[None]) ** 2).sum(-1)).mean())


@torch.no_grad()
def attention_distances(model, pixels: torch.Tensor, *, batch_size: int = 100) -> np.ndarray:
    """``(B,K,…)`` pixel values → ``(L,H)`` mean attention distance over all of them (batches weighted
    by their size)."""
    total, seen = None, 0
    for i in range(0, len(pixels), batch_size):
        x = pixels[i:i + batch_size]
        d = mean_attention_distance(image_attentions(model, x), model.config.image) * len(x)  # (L,H)
        total, seen = (d if total is None else total + d), seen + len(x)
    return total / max(seen, 1)


def held_out_pixels(model_path, image, data: str | None) -> tuple[torch.Tensor, str]:
    """``(pixel values, where they came from)``: ``data``, else the training run's held-out set."""
    if data is None:
        run = Path(str(model_path)) / "run.json"
        meta = json.loads(run.read_text(encoding="utf-8")) if run.is_file() else {}
        if meta.get("kind") != "image" or "train_config" not in meta:
            raise QkvError(f"{model_path} is not an image run folder (no run.json of qkv pretrain --objective "
                           "image); give the images with --data dataset:NAME[:SPLIT] or --data FOLDER")
        cfg = ImageTrainConfig.from_dict(meta["train_config"]).resolved()
        _, held, how = read_image_data(cfg)
        pixels, source = held.pixels, f"the run's held-out images ({how})"
    elif data.startswith("dataset:"):
        held = open_images(data)
        pixels, source = held.pixels, data
    else:
        return read_pictures(picture_files([data]), image)[0], data
    want = (image.channels, *image.size)
    if tuple(pixels.shape[1:]) != want:
        raise ImageDataError(f"{source} holds {'×'.join(map(str, pixels.shape[1:]))} images but the model reads "
                             f"{describe_size(image)}; give images of the model's size with --data")
    return pixel_values(pixels), source


def run_analyze_images(model_path, out_dir, *, data: str | None = None, images: int = 500, seed: int = 0,
                       batch_size: int = 100) -> tuple[DistanceReport, dict[str, Path]]:
    """Load the image model, measure each head's mean attention distance on a seeded sample of
    ``images`` held-out images, write the files (see the module docstring)."""
    if images < 1 or batch_size < 1:
        raise QkvError(f"--images {images} and --batch-size {batch_size} must be ≥ 1")
    model, _ = load_image_model(model_path, command="qkv analyze")
    image = model.config.image
    pixels, source = held_out_pixels(model_path, image, data)
    if len(pixels) > images:
        pick = np.sort(np.random.default_rng(seed).permutation(len(pixels))[:images])
        pixels = pixels[torch.as_tensor(pick)]
    report = DistanceReport(attention_distances(model, pixels, batch_size=batch_size), uniform_distance(image),
                            len(pixels), source)
    out = output_folder(out_dir)
    name = Path(str(model_path)).name
    paths = plots.save_formats(distance_figure(report.distances, report.uniform,
                                               title=f"{name}: mean attention distance, {report.images} images"),
                               out / "attention_distance")
    md = (f"# Mean attention distance: {name}\n\n{report.images} images: {source}. Distances in pixels between a "
          f"query patch's centre and the patches it attends to, weighted by attention; uniform attention over the "
          f"{'×'.join(map(str, image.grid))} patches gives {report.uniform:.2f}.\n\n{report.table()}\n\n"
          "![distance against layer](attention_distance.png)\n")
    atomic_write_text(out / "attention_distance.md", md)
    atomic_write_text(out / "attention_distance.json", json.dumps(
        {"model": str(model_path), "images": report.images, "source": source, "uniform": round(report.uniform, 6),
         "distances": np.round(report.distances, 6).tolist()}, indent=1) + "\n")
    return report, {"png": paths["png"], "md": out / "attention_distance.md", "json": out / "attention_distance.json"}
