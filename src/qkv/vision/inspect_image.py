"""``qkv inspect MODEL picture.png``: one picture through an image model — each layer's and head's
attention from the [CLS] token (or a chosen patch) drawn over the picture, attention rollout, and
for an image captioner the decoder's cross-attention over the picture for each word it writes.

Legend: L layers, H heads, T tokens (P prefix + N patches), U written words, K channels, R × W pixels.

Files written into the output folder (``ext``: the formats asked for, PNG by default):

    image_attention_layer_K.ext   layer K's heads: the query's weights over the picture
    image_rollout.ext             the query's attention rollout after each layer (layers 0…K)
    cross_attention_layer_K.ext   a captioner's layer K: per written word, its heads' mean weights
    viewer.html                   the picture with the selected token's attention over it, and the
                                  token (patch) views of the text viewer: head, matrix and model view
    inspection.json               the query, the prediction or caption, the shapes
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from qkv._fs import atomic_write_text
from qkv.analysis import plots
from qkv.analysis.seq2seq_inspect import output_folder
from qkv.analysis.viewer_html import render_viewer
from qkv.data.errors import CorpusNotFoundError
from qkv.data.images import IMAGE_SUFFIXES, read_image
from qkv.errors import QkvError
from qkv.models.vision import ImageCaptioner, ImageClassifier
from qkv.vision.attention_maps import image_attentions, rollout, to_grid
from qkv.vision.caption import caption_with_attention
from qkv.vision.figures import maps_over_picture
from qkv.vision.pictures import is_picture_spec, load_image_model, read_pictures

__all__ = ["ImageInspection", "inspect_picture", "write_image_inspection", "run_inspect_picture", "patch_tokens",
           "query_index"]

#: The end-of-caption token names looked up in a captioner's tokenizer (the first one it has).
EOS_NAMES = ("[EOS]", "</s>", "<eos>", "[SEP]")


@dataclass
class ImageInspection:
    """One picture through an image model.

    Attributes:
        picture: the file. pixels: ``(K,R,W)`` uint8 as the model read it (its channels).
        tokens: the T token names (``[CLS]``, then ``r0c0`` … in reading order).
        query: the token whose attention the figures draw (0: [CLS]; else a patch).
        attentions: ``(L,H,T,T)`` the encoder's exact weights. rollout: ``(L,T,T)`` after layers 0…l.
        prediction: a classifier's ``{"label", "probability"}``, else ``None``.
        words: a captioner's written words (greedy), cross_attentions ``(L,H,U,T)`` their weights.
        notes: what the reader did (a colour picture read as grey, …).
    """

    picture: Path
    pixels: np.ndarray
    tokens: list[str]
    query: int
    attentions: np.ndarray
    rollout: np.ndarray
    prediction: dict | None = None
    words: list[str] = field(default_factory=list)
    cross_attentions: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)


def patch_tokens(image) -> list[str]:
    """``[CLS]`` (when the model has one) and each patch's name: ``r{row}c{col}`` (``p{i}`` for signals)."""
    grid = image.grid
    names = [f"r{i // grid[1]}c{i % grid[1]}" if len(grid) == 2 else f"p{i}" for i in range(image.n_patches)]
    return (["[CLS]"] if image.cls_token else []) + names


def query_index(image, patch: tuple[int, int] | None) -> int:
    """The token index of ``patch`` (row, column from 0), or of [CLS] when ``patch`` is ``None``.

    Raises:
        QkvError: no [CLS] token and no patch given; a patch outside the grid.
    """
    if patch is None:
        if not image.cls_token:
            raise QkvError("the model has no [CLS] token; choose the querying patch with --patch ROW,COL")
        return 0
    rows, cols = image.grid
    r, c = patch
    if not (0 <= r < rows and 0 <= c < cols):
        raise QkvError(f"--patch {r},{c} is outside the model's {rows}×{cols} grid of patches; give a row in [0, "
                       f"{rows - 1}] and a column in [0, {cols - 1}]")
    return image.prefix + r * cols + c


def _rollouts(attentions: np.ndarray) -> np.ndarray:
    """``(L,H,T,T)`` → ``(L,T,T)``: the rollout of layers 0…l for each l."""
    return np.stack([rollout(attentions[:layer + 1]) for layer in range(len(attentions))])


def _eos_id(tokenizer, model: ImageCaptioner) -> int | None:
    decoder = model.config.decoder
    if decoder is not None and decoder.eos_token_id is not None:
        return decoder.eos_token_id
    for name in EOS_NAMES if tokenizer is not None else ():
        found = tokenizer.token_to_id(name)
        if found is not None:
            return int(found)
    return None


def _caption(model: ImageCaptioner, tokenizer, x: torch.Tensor) -> tuple[list[str], np.ndarray]:
    """Greedy caption of ``(1,K,R,W)`` (:func:`~qkv.vision.caption.caption_with_attention`): the written
    words up to and with the end token, and ``(L,H,U,T)`` their cross-attention (row u: the decoder
    position that wrote word u)."""
    eos = _eos_id(tokenizer, model)
    written = caption_with_attention(model, tokenizer, x, batch_size=1, eos_token_id=eos)
    row = written.ids[0, 1:].tolist()  # (n,)
    n = row.index(eos) + 1 if eos is not None and eos in row else len(row)
    if not n:
        return [], np.zeros((0,))
    name = (lambda i: tokenizer.id_to_token(i) or str(i)) if tokenizer is not None else str
    return [name(i) for i in row[:n]], written.cross_attentions[0, :, :, :n].numpy()  # (L,H,n,T) -> (L,H,U,T)


@torch.no_grad()
def inspect_picture(model, picture: str | Path, *, tokenizer=None, patch: tuple[int, int] | None = None
                    ) -> ImageInspection:
    """Run ``model`` (an image model) on the picture file (see the module docstring)."""
    image = model.config.image
    query = query_index(image, patch) if len(image.size) == 2 else 0
    x, notes = read_pictures([Path(picture)], image)  # (1,K,R,W); refuses another size
    was = model.training
    model.eval()
    try:
        att = image_attentions(model, x)[0]  # (L,H,T,T)
        ins = ImageInspection(Path(picture), read_image(picture, channels=image.channels), patch_tokens(image), query,
                              att, _rollouts(att), notes=notes)
        if isinstance(model, ImageClassifier):
            p = torch.softmax(model(x).logits.float()[0], -1)  # (L,)
            k = int(p.argmax())
            ins.prediction = {"label": model.task.labels[k], "probability": float(p[k])}
        elif isinstance(model, ImageCaptioner):
            ins.words, ins.cross_attentions = _caption(model, tokenizer, x)
    finally:
        model.train(was)
    return ins


def _png_base64(pixels: np.ndarray) -> str:
    """``(K,R,W)`` uint8 → base64 of a PNG."""
    arr = pixels[0] if pixels.shape[0] == 1 else pixels.transpose(1, 2, 0)  # (R,W) or (R,W,3)
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(arr)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def write_image_inspection(ins: ImageInspection, image, out_dir: str | Path, *, title: str = "",
                           formats: tuple[str, ...] = ("png",)) -> dict[str, Path]:
    """Write the figures, ``viewer.html`` and ``inspection.json`` (see the module docstring); returns
    the paths by name (``layer_0``, ``rollout``, ``cross_0``, ``viewer``, ``json``; an SVG's name ends
    in ``_svg``)."""
    out = output_folder(out_dir)
    paths: dict[str, Path] = {}

    def save(fig, name: str, stem: str) -> None:
        for fmt, path in plots.save_formats(fig, out / stem, formats, dpi=90).items():
            paths[name if fmt == formats[0] else f"{name}_{fmt}"] = path

    L, H = ins.attentions.shape[:2]
    who = ins.tokens[ins.query]
    cell = None if ins.query < image.prefix else divmod(ins.query - image.prefix, image.grid[1])
    for layer in range(L):
        maps = to_grid(ins.attentions[layer, :, ins.query], image)  # (H,rows,cols)
        save(maps_over_picture(ins.pixels, maps, image, [f"L{layer}H{h}" for h in range(H)], query_cell=cell,
                               title=f"layer {layer}: {who}'s attention over the picture, per head"),
             f"layer_{layer}", f"image_attention_layer_{layer}")
    save(maps_over_picture(ins.pixels, to_grid(ins.rollout[:, ins.query], image), image,
                           [f"L0…L{layer}" for layer in range(L)], query_cell=cell,
                           title=f"attention rollout of {who} (the heads averaged, the residual added)"),
         "rollout", "image_rollout")
    if ins.words:
        for layer in range(len(ins.cross_attentions)):
            maps = to_grid(ins.cross_attentions[layer].mean(axis=0), image)  # (U,rows,cols), heads averaged
            save(maps_over_picture(ins.pixels, maps, image, ins.words,
                                   title=f"decoder layer {layer}: cross-attention over the picture per written "
                                   "word (heads averaged)"), f"cross_{layer}", f"cross_attention_layer_{layer}")
    what = (f"predicted {ins.prediction['label']} ({ins.prediction['probability']:.3f})" if ins.prediction
            else f"caption: {' '.join(ins.words)}" if ins.words else "")
    subtitle = " · ".join(s for s in (title, what, f"{len(ins.tokens)} tokens ([CLS] and patches)",
                                      f"{L} layers × {H} heads") if s)
    picture = {"png": _png_base64(ins.pixels), "size": list(image.size), "grid": list(image.grid),
               "patch": list(image.patch), "stride": list(image.strides), "prefix": image.prefix, "query": ins.query}
    page = render_viewer(ins.tokens, [t == "[CLS]" for t in ins.tokens], ins.attentions,
                         title=f"qkv attention — {title}", subtitle=subtitle, maps={"rollout": ins.rollout},
                         notes=ins.notes, picture=picture)
    paths["viewer"] = out / "viewer.html"
    atomic_write_text(paths["viewer"], page)
    summary = {"picture": str(ins.picture), "query": who, "tokens": len(ins.tokens), "layers": L, "heads": H,
               "prediction": ins.prediction, "caption": ins.words or None, "notes": ins.notes,
               "rollout_of_query": np.round(to_grid(ins.rollout[-1, ins.query], image), 6).tolist()}
    paths["json"] = out / "inspection.json"
    atomic_write_text(paths["json"], json.dumps(summary, indent=1) + "\n")
    return paths


def run_inspect_picture(model_path, picture: str, out_dir: str | Path, *, patch: tuple[int, int] | None = None,
                        formats: tuple[str, ...] = ("png",)) -> tuple[ImageInspection, dict[str, Path]]:
    """Load the image model in ``model_path``, inspect ``picture`` and write the files into ``out_dir``."""
    model, tokenizer = load_image_model(model_path, command="qkv inspect")
    if Path(picture).suffix.lower() in IMAGE_SUFFIXES and not Path(picture).exists():
        raise CorpusNotFoundError(f"{picture}: no such picture file")
    if not is_picture_spec(picture) or Path(picture).is_dir():
        raise QkvError(f"{model_path} is an image model; give it one picture file (PNG or JPEG), not {picture!r}")
    if len(model.config.image.size) != 2:
        raise QkvError(f"{model_path}: the model reads 1-D signals, not pictures; qkv inspect draws attention over "
                       "pictures")
    ins = inspect_picture(model, picture, tokenizer=tokenizer, patch=patch)
    name = Path(str(model_path)).name if not isinstance(model_path, tuple) else "model"
    return ins, write_image_inspection(ins, model.config.image, out_dir, title=name, formats=formats)
