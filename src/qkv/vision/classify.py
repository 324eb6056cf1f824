"""Image classification on the training engine: the objective, the run, the held-out report.

Order of work: read the training and held-out images and check them against the model (size,
channels, classes) — each problem one line before anything is written —, create the run folder,
train with :func:`qkv.training.engine.run_training` (steps or a time budget, bf16, checkpoints,
``--resume``, ``metrics.jsonl``, ``curve.png``), then score every held-out image.

Run folder::

    run.json                      configs, data summary, status, the held-out report's summary
    metrics.jsonl, curve.png      training loss; held-out accuracy on a fixed sample during training
    checkpoints/                  see qkv.training.checkpoint
    qkv.json, model.safetensors   the model (``qkv.load(run)``)
    report.json                   accuracy on the whole held-out set, per class, the majority baseline
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from qkv._fs import atomic_write_text
from qkv.checkpoints.io import save
from qkv.data.errors import ImageDataError
from qkv.data.image_datasets import open_images
from qkv.data.images import ImageSet, pixel_values
from qkv.models.heads import TaskConfig
from qkv.models.vision_builders import build_image_classifier
from qkv.training.distributed import refuse_world
from qkv.vision.augment import augment_batch
from qkv.vision.config import ImageTrainConfig, model_config
from qkv.vision.mirror import view_probabilities
from qkv.vision.run_setup import vision_run

__all__ = ["ImageBatch", "ImageClassificationObjective", "ImageResult", "train_images", "read_image_data",
           "accuracy", "accuracies", "split_images"]


@dataclass(frozen=True)
class ImageBatch:
    """A training batch: ``pixel_values (B,K,…)`` and ``labels (B,)``."""

    pixel_values: torch.Tensor
    labels: torch.Tensor


@dataclass
class ImageResult:
    """A finished or interrupted image run (``report`` is ``None`` when interrupted)."""

    out: Path
    steps_done: int
    status: str
    report: dict | None


def split_images(images: ImageSet, fraction: float, seed: int) -> tuple[ImageSet, ImageSet]:
    """A seeded, stratified split: ``(rest, held out)`` with ``round(fraction · n)`` (≥ 1) of each class held out."""
    rng = np.random.default_rng([seed, 0x1A6E])
    held = np.zeros(len(images), dtype=bool)
    for c in range(len(images.classes)):
        idx = np.flatnonzero(images.labels == c)
        k = min(len(idx) - 1, max(1, round(fraction * len(idx))))
        if k < 1:
            raise ImageDataError(f"{images.name}: class {images.classes[c]!r} has {len(idx)} image(s); hold out at "
                                 "least one and train on one needs 2 — add images or give --eval-data")
        held[rng.permutation(idx)[:k]] = True
    pick = lambda m: ImageSet(images.pixels[m], images.labels[m], images.classes, images.name)  # noqa: E731
    return pick(~held), pick(held)


def read_image_data(cfg: ImageTrainConfig) -> tuple[ImageSet, ImageSet, str]:
    """``(train, held out, how the held-out set was chosen)``."""
    train = open_images(cfg.data)
    if cfg.eval_data is not None:
        held, how = open_images(cfg.eval_data), cfg.eval_data
    elif cfg.data.startswith("dataset:"):
        if cfg.data.rstrip(":").lower().endswith(":test"):
            raise ImageDataError(f"--data {cfg.data} is the test split, which is held out: train on the train split")
        name = cfg.data.split(":")[1]
        held, how = open_images(f"dataset:{name}:test"), f"dataset:{name}:test"
    else:
        train, held = split_images(train, cfg.eval_fraction, cfg.seed)
        how = f"a stratified {cfg.eval_fraction:g} of {cfg.data} (seed {cfg.seed})"
    if held.size != train.size or held.channels != train.channels or held.classes != train.classes:
        raise ImageDataError(f"held-out images ({how}: {held.channels}×{'×'.join(map(str, held.size))}, classes "
                             f"{list(held.classes)[:5]}) do not match the training images ({train.channels}×"
                             f"{'×'.join(map(str, train.size))}, {list(train.classes)[:5]})")
    return train, held, how


def accuracies(model, images: ImageSet, *, batch_size: int = 500, limit: np.ndarray | None = None,
               mirror: bool = False) -> tuple[dict, dict | None]:
    """``(plain, mirrored)`` held-out figures of ``model`` in one pass (eval mode, no grad): each
    ``accuracy``, ``eval_loss`` (cross-entropy, nats per image), ``eval_images`` and ``per_class``
    accuracy; ``mirrored`` (with ``mirror``, else ``None``) scores the probabilities averaged with each
    image's mirror image's (:func:`qkv.vision.mirror.view_probabilities`)."""
    idx = np.arange(len(images)) if limit is None else limit
    loss, preds = [0.0, 0.0], ([], [])
    was = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(idx), batch_size):
            take = idx[i:i + batch_size]
            y = torch.as_tensor(images.labels[take])
            views = view_probabilities(model, pixel_values(images.pixels[take]), mirror=mirror)  # (B,L) each
            for v, probs in enumerate(views):
                if probs is not None:
                    loss[v] += float(F.nll_loss(probs.clamp_min(1e-30).log(), y, reduction="sum"))
                    preds[v].append(probs.argmax(-1).numpy())
    model.train(was)
    truth = images.labels[idx]
    mirrored = _figures(preds[1], loss[1], truth, images.classes) if mirror else None
    return _figures(preds[0], loss[0], truth, images.classes), mirrored


def _figures(preds: list[np.ndarray], loss: float, truth: np.ndarray, classes) -> dict:
    pred = np.concatenate(preds) if preds else np.zeros(0, dtype=np.int64)
    per_class = {name: float((pred[truth == c] == c).mean()) if (truth == c).any() else None
                 for c, name in enumerate(classes)}
    n = max(1, len(truth))
    return {"accuracy": int((pred == truth).sum()) / n, "eval_loss": loss / n, "eval_images": int(len(truth)),
            "per_class": per_class}


def accuracy(model, images: ImageSet, *, batch_size: int = 500, limit: np.ndarray | None = None,
             mirror: bool = False) -> dict:
    """The held-out figures of :func:`accuracies`: with ``mirror``, the mirrored ones."""
    plain, mirrored = accuracies(model, images, batch_size=batch_size, limit=limit, mirror=mirror)
    return mirrored if mirror else plain


class ImageClassificationObjective:
    """Cross-entropy (with label smoothing) of batch ``i``: a seeded shuffle per epoch, cut into batches
    (the last partial one dropped), augmented from a generator seeded by ``i``; held out, accuracy on a
    fixed sample."""

    metric, metric_label, loss_label = "accuracy", "accuracy", "loss"  # the curve says "held-out …"
    rate_unit = "images"  # metrics.jsonl logs images_per_s (an image batch has no token mask)

    def __init__(self, train: ImageSet, held: ImageSet, *, batch_size: int, seed: int, augment: tuple[str, ...],
                 label_smoothing: float, eval_sample: int, eval_batch_size: int):
        if len(train) < batch_size:
            raise ImageDataError(f"{train.name}: {len(train)} training images, fewer than one batch of {batch_size}; "
                                 "lower --batch-size")
        self.train, self.held, self.batch_size, self.seed = train, held, batch_size, seed
        self.augment, self.label_smoothing, self.eval_batch_size = augment, label_smoothing, eval_batch_size
        self.per_epoch = len(train) // batch_size
        rng = np.random.default_rng([seed, 0xE7A1])
        self.sample = np.sort(rng.permutation(len(held))[:eval_sample])
        self._order: tuple[int, np.ndarray] | None = None

    def _epoch(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.train)))
        return self._order[1]

    def batch(self, index: int) -> ImageBatch:
        epoch, j = divmod(index, self.per_epoch)
        take = self._epoch(epoch)[j * self.batch_size:(j + 1) * self.batch_size]
        x = pixel_values(self.train.pixels[take])
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return ImageBatch(augment_batch(x, self.augment, g), torch.as_tensor(self.train.labels[take]))

    def rate_count(self, batch: ImageBatch) -> int:
        return len(batch.labels)

    def units(self, batch: ImageBatch) -> torch.Tensor:
        return torch.tensor(float(len(batch.labels)))

    def loss(self, model, batch: ImageBatch) -> torch.Tensor:
        logits = model(batch.pixel_values).logits  # (B,L)
        return F.cross_entropy(logits.float(), batch.labels, label_smoothing=self.label_smoothing)

    def evaluate(self, model) -> dict:
        ev = accuracy(model, self.held, batch_size=self.eval_batch_size, limit=self.sample)
        ev.pop("per_class")
        return ev

    def describe(self, ev: dict) -> str:
        return f"held-out accuracy {ev['accuracy']:.4f} ({ev['eval_images']} images), loss {ev['eval_loss']:.4f}"

    def save(self, model, out: Path) -> None:
        save(model, out)


def _fingerprint(*sets: ImageSet) -> str:
    h = hashlib.sha256()
    for s in sets:
        h.update(np.ascontiguousarray(s.pixels).tobytes())
        h.update(np.ascontiguousarray(s.labels).tobytes())
    return h.hexdigest()


def _model_config(cfg: ImageTrainConfig, train: ImageSet):
    """The recipe's model sized for the data (a user folder's size and channels) with ``--model`` on top."""
    given = cfg.model.get("image", {}) if isinstance(cfg.model.get("image"), dict) else {}
    data_shape = {k: v for k, v in (("size", list(train.size)), ("channels", train.channels)) if k not in given}
    config = model_config(cfg.preset, {**cfg.model, "image": {**data_shape, **given}})
    image = config.image
    if tuple(image.size) != train.size or image.channels != train.channels:
        raise ImageDataError(f"the model reads {image.channels}×{'×'.join(map(str, image.size))} images but {train.name} "
                             f"holds {train.channels}×{'×'.join(map(str, train.size))}; drop image.size/channels from "
                             "--model (they follow the data)")
    return config


def train_images(cfg: ImageTrainConfig, *, resume: bool = False, clock=time.monotonic,
                 on_backward=None, transform=None) -> ImageResult:
    """Train an image classifier as ``cfg`` says (see the module docstring). ``transform``: a
    deterministic ``(ImageSet, "train" | "held") → ImageSet`` applied to the images read (the lab's
    patch shuffles); the run's data fingerprint is taken after it."""
    refuse_world("image training runs in one process; run it without torchrun")
    cfg = cfg.resolved()
    train, held, how = read_image_data(cfg)
    if transform is not None:
        train, held = transform(train, "train"), transform(held, "held")
    config = _model_config(cfg, train)
    task = TaskConfig("sequence-classification", train.classes, pooling=cfg.pooling, classifier_dropout=0.0)
    summary = {"train_images": len(train), "held_out_images": len(held), "held_out": how,
               "classes": list(train.classes), "size": list(train.size), "channels": train.channels}
    with vision_run(cfg, kind="image", what="images", model_config=config, summary=summary,
                    fingerprint=lambda: _fingerprint(train, held), resume=resume) as started:
        run = started.run
        if started.report is not None:
            return ImageResult(run.out, started.steps_done, "complete", started.report)
        model = build_image_classifier(config, task)
        objective = ImageClassificationObjective(train, held, batch_size=cfg.batch_size, seed=cfg.seed,
                                                 augment=cfg.augment, label_smoothing=cfg.label_smoothing,
                                                 eval_sample=cfg.eval_sample, eval_batch_size=cfg.eval_batch_size)
        if cfg.progress:
            span = f"{cfg.time_budget:g} min" if cfg.time_budget is not None else f"{cfg.steps} steps"
            print(f"qkv pretrain --objective image: {len(train)} images ({train.name}), {len(train.classes)} classes, "
                  f"held out {len(held)} ({how}); {config.image.n_tokens} tokens per image; {span}, batch "
                  f"{cfg.batch_size}, lr {cfg.lr:g}, augment {','.join(cfg.augment) or 'none'}", flush=True)
        result = started.train(objective, model, title=f"{cfg.preset} on {train.name}", clock=clock,
                               on_backward=on_backward)
        if result.status != "complete":
            return ImageResult(run.out, result.steps_done, result.status, None)
        # trained on mirror images too (flip): test-time mirroring reported beside, from the same pass
        report, mirrored = accuracies(model, held, batch_size=cfg.eval_batch_size, mirror="flip" in cfg.augment)
        if mirrored is not None:
            report.update(accuracy_mirrored=mirrored["accuracy"], per_class_mirrored=mirrored["per_class"])
        counts = np.bincount(train.labels, minlength=len(train.classes))
        majority = int(counts.argmax())
        report.update(majority_baseline=float((held.labels == majority).mean()), held_out=how,
                      train_minutes=round(result.elapsed_s / 60, 2), steps=result.steps_done,
                      images_per_s=round((result.steps_done - result.start_step) * cfg.batch_size * cfg.grad_accum
                                         / max(result.train_s, 1e-9), 1), precision=started.precision)
        atomic_write_text(run.out / "report.json", json.dumps(report, indent=2))
        run.update(report={k: report[k] for k in ("accuracy", "accuracy_mirrored", "majority_baseline", "train_minutes")
                           if k in report})
        return ImageResult(run.out, result.steps_done, "complete", report)
