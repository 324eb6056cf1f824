"""The positions question on images (``qkv lab image-positions``): does a Vision Transformer need to
know where its patches are, and does it need them in reading order?

Legend: N images, K channels, R × W pixels (L samples), G patches, p patch size.

One image recipe (:data:`qkv.vision.config.RECIPES`) trained four ways on the same data, over seeds:

* ``learned`` — learned patch positions added to the patches (whatever the recipe's own scheme);
* ``none`` — no positions: the model sees a bag of patches;
* ``shuffled-fixed`` — the patches of every image (training and held out) moved by one permutation
  (drawn from the seed), with learned positions: the order is scrambled but consistent;
* ``shuffled-per-image`` — each image's patches moved by a permutation of its own (with learned
  positions): where a patch sits says nothing.

Every run is an ordinary image run (:func:`qkv.vision.classify.train_images`), without augmentation
(a flip or shift of shuffled patches would break the consistent order the question is about), in
``out/VARIANT-sSEED``
(a finished one is reused, an interrupted one resumed). The verdict pairs the variants seed by seed
(:func:`qkv.lab.verdict.compare`, Holm-corrected; decided when every seed differs by ≥ 10 accuracy
points the same way) for three comparisons: positions against none, a consistent shuffle against
reading order, a per-image shuffle against reading order. Written: ``verdict.json`` and ``verdict.md``.

Every variant cuts its patches from the pixels, whatever the recipe's stem: a convolutional stem's
zero padding tells it where the image's border is (positions through the back door), and its
3×3 windows would mix the neighbours a shuffle puts side by side.

The shuffles move whole patches, so they need patches side by side (stride = patch): a recipe with
overlapping patches (``vit-mnist1d``: 4 samples every 2) is run with ``--model '{"image": {"stride": 4}}'``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qkv._fs import atomic_write_text
from qkv.config_image import ImageConfig
from qkv.data.images import ImageSet
from qkv.errors import QkvError
from qkv.lab.grid import DECISION_GAP
from qkv.lab.report import mean_pm
from qkv.lab.verdict import Comparison, compare, with_holm
from qkv.vision.config import ImageTrainConfig, model_config
from qkv.vision.classify import train_images

__all__ = ["VARIANTS", "COMPARISONS", "shuffle_patches", "ImagePositionsResult", "run_image_positions"]

VARIANTS = ("learned", "none", "shuffled-fixed", "shuffled-per-image")
#: (a, b, what the comparison asks)
COMPARISONS = (("learned", "none", "do positions help?"),
               ("learned", "shuffled-fixed", "does reading order matter, given a consistent order?"),
               ("learned", "shuffled-per-image", "does a consistent order matter?"))


def shuffle_patches(images: ImageSet, image: ImageConfig, rng: np.random.Generator, *, per_image: bool) -> ImageSet:
    """``images`` with whole patches moved: one permutation for all (``per_image=False``) or one each.

    Raises:
        QkvError: overlapping patches (stride ≠ patch), which cannot be moved whole.
    """
    if image.strides != image.patch:
        raise QkvError(f"the shuffled variants move whole patches, but patches of {list(image.patch)} every "
                       f"{list(image.strides)} overlap; run with patches side by side, e.g. --model "
                       f"'{{\"image\": {{\"stride\": {image.patch[0]}}}}}'")
    x = images.pixels
    n, k = x.shape[:2]
    grid, p = image.grid, image.patch
    if len(grid) == 2:  # (N,K,R,W) -> (N,K,gr,ph,gc,pw) -> (N,K,gr,gc,ph,pw) -> (N,K,G,ph,pw)
        cut = x.reshape(n, k, grid[0], p[0], grid[1], p[1]).transpose(0, 1, 2, 4, 3, 5).reshape(n, k, -1, *p)
    else:  # (N,K,L) -> (N,K,G,p)
        cut = x.reshape(n, k, grid[0], p[0])
    g = cut.shape[2]
    if per_image:
        cut = np.stack([cut[i][:, rng.permutation(g)] for i in range(n)])
    else:
        cut = cut[:, :, rng.permutation(g)]
    if len(grid) == 2:  # back: (N,K,gr,gc,ph,pw) -> (N,K,gr,ph,gc,pw) -> (N,K,R,W)
        x = cut.reshape(n, k, grid[0], grid[1], *p).transpose(0, 1, 2, 4, 3, 5).reshape(images.pixels.shape)
    else:
        x = cut.reshape(images.pixels.shape)
    return ImageSet(np.ascontiguousarray(x), images.labels, images.classes, images.name)


def _transform(variant: str, image: ImageConfig, seed: int):
    """The data change of ``variant``: ``(ImageSet, part) → ImageSet`` or ``None``."""
    if not variant.startswith("shuffled"):
        return None
    per_image = variant == "shuffled-per-image"

    def change(images: ImageSet, part: str) -> ImageSet:
        # the same permutation for both parts when fixed; per image: each part its own stream
        stream = [seed, 0x5EED] + ([1 if part == "train" else 2] if per_image else [])
        return shuffle_patches(images, image, np.random.default_rng(stream), per_image=per_image)
    return change


@dataclass
class ImagePositionsResult:
    """Attributes: ``accuracy`` variant → seed → held-out accuracy; ``comparisons``; ``markdown``."""

    accuracy: dict[str, dict[int, float]]
    comparisons: list[Comparison]
    markdown: str


def _verdict_lines(comparisons: list[Comparison]) -> list[str]:
    asks = {(a, b): q for a, b, q in COMPARISONS}
    def test(c: Comparison) -> str:
        return (f"paired t-test p = {c.p:.3g}, Holm {c.p_holm:.3g}" if math.isfinite(c.p)
                else "no test with one seed")
    return [f"- {c.a} vs {c.b} ({asks[(c.a, c.b)]}): mean difference {c.mean:+.3f}; {c.sentence()} ({test(c)})"
            for c in comparisons]


def _markdown(base: ImageTrainConfig, acc: dict, comparisons: list[Comparison]) -> str:
    lines = [f"# Why positions, on images: {base.preset} on {base.data}", "",
             f"{len(next(iter(acc.values())))} seed(s); held-out accuracy; decided = every seed ahead by ≥ "
             f"{DECISION_GAP:.2f}.", "", "| Variant | Mean ± std | Per seed |", "|---|---|---|"]
    for variant, per_seed in acc.items():
        lines.append(f"| {variant} | {mean_pm(list(per_seed.values()))} | "
                     + ", ".join(f"{per_seed[k]:.3f}" for k in sorted(per_seed)) + " |")
    return "\n".join(lines + ["", "Verdicts:", "", *_verdict_lines(comparisons), ""])


_RUN_NAME = re.compile(r"^(" + "|".join(VARIANTS) + r")-s[0-9]+$")


def _check_out(out: Path) -> None:
    """Refuse an ``--out`` that is a file, or a folder holding anything this command did not write (a rerun
    continues a folder it made)."""
    if out.is_file():
        raise QkvError(f"--out {out} is a file, not a folder; choose another --out")
    if out.is_dir():
        foreign = [p.name for p in out.iterdir() if not p.name.startswith(".") and not _RUN_NAME.match(p.name)
                   and p.name not in ("verdict.json", "verdict.md")]
        if foreign:
            raise QkvError(f"--out {out} holds files qkv lab image-positions did not write ({foreign[0]}); choose a new "
                           "or empty --out (a folder it made is continued)")


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else x


def run_image_positions(out: str | Path, *, preset: str = "vit-digits", data: str | None = None,
                        seeds: int = 3, steps: int | None = None, time_budget: float | None = None,
                        batch_size: int | None = None, model: dict | None = None,
                        variants: tuple[str, ...] = VARIANTS, progress=print) -> ImagePositionsResult:
    """Train ``variants`` × ``seeds`` runs of ``preset`` and decide the comparisons (module docstring)."""
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise QkvError(f"--variants {','.join(variants)!r}: allowed {', '.join(VARIANTS)} (comma-separated)")
    if seeds < 1:
        raise QkvError(f"--seeds {seeds} must be ≥ 1")
    out = Path(out)
    _check_out(out)
    model = dict(model or {})
    if "position" in (model.get("image") or {}):
        raise QkvError("--model sets image.position, but the lab sets each variant's positions itself (learned or "
                       "none); drop image.position from --model")
    if "stem" in (model.get("image") or {}):
        raise QkvError("--model sets image.stem, but the lab's variants have no convolutional stem (its zero padding "
                       "would tell a model without positions where the border is); drop image.stem from --model")
    acc: dict[str, dict[int, float]] = {}
    for variant in variants:
        # every variant names its positions (learned ones, whatever the recipe's own scheme) and has no stem
        image_over = {**model.get("image", {}), "position": "none" if variant == "none" else "learned", "stem": []}
        over = {**model, "image": image_over}
        image = model_config(preset, over).image if variant.startswith("shuffled") else None
        for seed in range(seeds):
            cfg = ImageTrainConfig(out=str(out / f"{variant}-s{seed}"), preset=preset, data=data, seed=seed,
                                   steps=steps, time_budget=time_budget, batch_size=batch_size, model=over,
                                   augment=(), progress=False)
            resume = (Path(cfg.out) / "run.json").is_file()
            earlier = " (finished earlier)" if (Path(cfg.out) / "report.json").is_file() else ""
            r = train_images(cfg, resume=resume, transform=_transform(variant, image, seed) if image else None)
            if r.status != "complete":
                raise QkvError(f"{variant} seed {seed} was interrupted; run the same command again to resume")
            acc.setdefault(variant, {})[seed] = float(r.report["accuracy"])
            if progress:
                progress(f"{variant} seed {seed}: held-out accuracy {r.report['accuracy']:.4f}{earlier}")
    comparisons = with_holm([compare(a, b, acc) for a, b, _ in COMPARISONS if a in acc and b in acc])
    base = ImageTrainConfig(out=str(out), preset=preset, data=data).resolved()
    md = _markdown(base, acc, comparisons)
    atomic_write_text(out / "verdict.md", md)
    atomic_write_text(out / "verdict.json", json.dumps(
        {"preset": preset, "data": base.data, "seeds": seeds, "steps": steps, "time_budget": time_budget,
         "model": model, "accuracy": {v: {str(s): a for s, a in d.items()} for v, d in acc.items()},
         "comparisons": [{"a": c.a, "b": c.b, "outcome": c.outcome, "winner": c.winner, "mean": _finite(c.mean),
                          "p": _finite(c.p), "p_holm": _finite(c.p_holm), "sentence": c.sentence()}
                         for c in comparisons]},
        indent=1) + "\n")
    return ImagePositionsResult(acc, comparisons, md)
