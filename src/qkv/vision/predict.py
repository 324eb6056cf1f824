"""``qkv predict`` on pictures: an image classifier's class and probabilities per picture, as JSONL.

Legend: N pictures, K channels, R × W pixels, L labels.

The output follows text prediction's conventions (:func:`qkv.finetune.predict.predict_file`): one
line per input, ``{"id": …, "label": …, "probabilities": {label: p}}`` with ``p`` rounded to 6
decimals, written atomically to ``--out``; an existing ``--out`` is replaced only with ``--force``.
The ``id`` of a picture is its path as given (a folder's pictures: the folder joined with their
path inside it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from qkv._fs import atomic_write_text, check_output_path
from qkv.errors import QkvError
from qkv.models.vision import ImageClassifier
from qkv.vision.mirror import class_probabilities
from qkv.vision.pictures import load_image_model, picture_files, read_pictures

__all__ = ["PicturePredictions", "classify_pictures", "predict_pictures"]


@dataclass
class PicturePredictions:
    """Attributes: ``labels`` (the model's label set), ``probabilities`` ``(N,L)``, ``notes``."""

    labels: tuple[str, ...]
    probabilities: torch.Tensor
    notes: list[str]

    def records(self) -> list[dict]:
        """One ``{"label": …, "probabilities": {label: p}}`` per picture (``p`` rounded to 6 decimals)."""
        out = []
        for row in self.probabilities.tolist():
            k = max(range(len(row)), key=row.__getitem__)
            out.append({"label": self.labels[k],
                        "probabilities": {lab: round(p, 6) for lab, p in zip(self.labels, row)}})
        return out


def _classifier(model, where) -> ImageClassifier:
    if not isinstance(model, ImageClassifier):
        raise QkvError(f"{where}: the image model has no classification head (it is a model of type {type(model).__name__}); "
                       "train a classifier with qkv pretrain --objective image, or use qkv inspect on it")
    return model


@torch.no_grad()
def classify_pictures(model: ImageClassifier, files: list[Path], *, batch_size: int = 64,
                      mirror: bool = False) -> PicturePredictions:
    """The class probabilities of each picture (the model in eval mode, restored after); with
    ``mirror``, averaged with its mirror image's (:mod:`qkv.vision.mirror`)."""
    x, notes = read_pictures(files, model.config.image)  # (N,K,R,W) — every file read before any is scored
    was = model.training
    model.eval()
    try:
        probs = torch.cat([class_probabilities(model, x[i:i + batch_size], mirror=mirror)  # (b,L)
                           for i in range(0, len(x), batch_size)])  # (N,L)
    finally:
        model.train(was)
    return PicturePredictions(tuple(model.task.labels), probs, notes)


def predict_pictures(run, inputs: list[str], out: str | os.PathLike, *, replace: bool = False,
                     batch_size: int = 64, mirror: bool = False) -> dict:
    """``qkv predict MODEL PICTURE… --out FILE``: the class of every picture into JSONL ``out``.

    Args:
        run: an image classifier's run or model folder, or what :func:`qkv.load` returned.
        inputs: PNG/JPEG files or folders of them (at any depth).
        out: the ``.jsonl`` file (written atomically). replace: replace an existing ``out``.
        mirror: average each picture's probabilities with its mirror image's (``--mirror``).

    Returns:
        ``{"inputs": N, "out": …, "notes": […]}``.
    """
    check_output_path(out, inputs=tuple(inputs), replace=replace)  # before loading anything
    if batch_size < 1:
        raise QkvError(f"--batch-size {batch_size} must be ≥ 1")
    files = picture_files(inputs)
    model, _ = load_image_model(run, command="qkv predict", what="an image classifier")
    result = classify_pictures(_classifier(model, run), files, batch_size=batch_size, mirror=mirror)
    lines = [json.dumps({"id": str(f), **rec}, ensure_ascii=False) for f, rec in zip(files, result.records())]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "".join(line + "\n" for line in lines))
    return {"inputs": len(files), "out": str(out), "notes": result.notes}
