"""The positions question on images, on scikit-learn's digits: the same Vision Transformer (``vit-digits``
with 2 × 2 patches: a 4 × 4 grid, 2 layers, 300 steps) with learned patch positions, with none, with
the patches shuffled the same way for every image (training and test), and shuffled per image.
Three seeds each; prints each run's held-out accuracy and the mean ± std per variant.

A measurement script, not a timing benchmark: ``PYTHONPATH=src python benchmarks/vision_positions.py``
(about 12 short runs; their folders go to runs/pos/). It swaps the run's data reader for one that
shuffles the patches (the image command has no shuffle option); docs/vision.md has the figures.
"""
import sys, json, numpy as np, torch
import qkv.vision.classify as C
from qkv.data.images import ImageSet
from qkv.vision.config import ImageTrainConfig

P = 2  # 2x2 patches of the 8x8 digits: a 4x4 grid
def shuffle(s: ImageSet, how, seed):
    x = s.pixels.reshape(len(s), 1, 4, P, 4, P).transpose(0, 1, 2, 4, 3, 5).reshape(len(s), 1, 16, P, P)
    rng = np.random.default_rng(seed)
    if how == "fixed":
        x = x[:, :, rng.permutation(16)]
    else:
        x = np.stack([xi[:, rng.permutation(16)] for xi in x])
    x = x.reshape(len(s), 1, 4, 4, P, P).transpose(0, 1, 2, 4, 3, 5).reshape(len(s), 1, 8, 8)
    return ImageSet(np.ascontiguousarray(x), s.labels, s.classes, s.name + f"/{how}")

orig = C.read_image_data
results = {}
for variant in ("learned", "none", "fixed", "per-image"):
    for seed in (0, 1, 2):
        def read(cfg, variant=variant):
            tr, he, how = orig(cfg)
            if variant in ("fixed", "per-image"):
                tr, he = shuffle(tr, variant, 7), shuffle(he, variant, 8 if variant == "per-image" else 7)
            return tr, he, how
        C.read_image_data = read
        pos = "none" if variant == "none" else "learned"
        cfg = ImageTrainConfig(out=f"runs/pos/{variant}-{seed}", preset="vit-digits", seed=seed, steps=300,
                               model={"image": {"patch": P, "position": pos}, "n_layers": 2}, progress=False,
                               eval_every=1000, threads=1)
        r = C.train_images(cfg).report
        results.setdefault(variant, []).append(r["accuracy"])
        print(variant, seed, r["accuracy"], flush=True)
for k, v in results.items():
    print(f"{k}: {np.mean(v):.3f} ± {np.std(v):.3f} over seeds {[round(a, 3) for a in v]}")
