"""What a captioning run depends on: :class:`CaptionTrainConfig` (stored in ``run.json``; ``--resume``
refuses a different one) and the recipes (:data:`CAPTION_RECIPES`: a model and its training settings).

A recipe's ``model`` is :class:`~qkv.config.ModelConfig` fields in the flat short names with an
``image`` section; the vocabulary (``vocab_size``) follows the grammar's tokenizer and the image
size the data; ``--model`` overrides the rest (``{"n_layers": 4}``, ``{"image": {"patch": 14}}``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from qkv.config import ModelConfig
from qkv.data.caption_grammar import SPECIALS
from qkv.training.config import RunConfig
from qkv.training.loop_fields import RecipeLoopFields, check_loop_values
from qkv.validation import check_choice, check_field_types, check_int, check_range

__all__ = ["CaptionTrainConfig", "CAPTION_RECIPES", "caption_model_config"]

_TEXT_SIDE = dict(type_vocab_size=0, pad_token_id=0, norm="pre", dropout=0.0, position="learned", layer_norm_eps=1e-6,
                  embedding_norm=False)

#: name → {model, training settings}. ``caption-fashion`` is a starting point for
#: ``dataset:fashion-captions`` (56×56 canvases: 64 patches of 7 pixels, 16 to a cell), not chosen by
#: a sweep; ``caption-tiny`` is a seconds-long run for tests on canvases of 8-pixel cells given in code
#: (one 8-pixel patch to a cell).
CAPTION_RECIPES: dict[str, dict[str, Any]] = {
    "caption-fashion": dict(
        model=dict(_TEXT_SIDE, d_model=64, n_heads=4, d_ff=128, n_layers=3, max_len=24,
                   image=dict(size=[56, 56], channels=1, patch=7, position="learned")),
        data="dataset:fashion-captions", batch_size=64, lr=2e-3, weight_decay=0.05, warmup_steps=100,
        schedule="cosine", label_smoothing=0.0, time_budget=12.0),
    "caption-tiny": dict(
        model=dict(_TEXT_SIDE, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_len=24,
                   image=dict(size=[16, 16], channels=1, patch=8, position="learned")),
        data="dataset:fashion-captions", batch_size=32, lr=5e-3, weight_decay=0.01, warmup_steps=20,
        schedule="cosine", label_smoothing=0.0, steps=300),
}


def caption_model_config(recipe: str, vocab_size: int, size: tuple[int, ...], channels: int,
                         overrides: dict[str, Any] | None = None) -> ModelConfig:
    """The :class:`ModelConfig` of ``recipe`` for a vocabulary of ``vocab_size`` and pictures of
    ``size`` and ``channels``, with ``overrides`` (flat names, sections, ``image``) on top."""
    if recipe not in CAPTION_RECIPES:
        raise ValueError(f"unknown caption recipe {recipe!r}; allowed: {', '.join(CAPTION_RECIPES)}")
    overrides = dict(overrides or {})
    if "vocab_size" in overrides:
        raise ValueError(f"--model vocab_size: it follows the caption grammar's tokenizer ({vocab_size}); drop it")
    base = dict(CAPTION_RECIPES[recipe]["model"])
    image = {**base.pop("image"), "size": list(size), "channels": channels}
    given = overrides.pop("image", None) or {}
    if not isinstance(given, dict):
        raise ValueError(f"--model image must be an object of image settings, got {given!r}")
    for k in ("size", "channels"):
        got = given.get(k, image[k])
        if (list(got) if isinstance(got, (list, tuple)) else got) != image[k]:
            raise ValueError(f"--model image.{k}={got!r}: it follows the data ({image[k]}); drop it")
    config = ModelConfig.from_flat(**base, vocab_size=vocab_size, image={**image, **given})
    return config.replace(**overrides) if overrides else config


@dataclass(frozen=True)
class CaptionTrainConfig(RecipeLoopFields, RunConfig):
    """A captioning run (``qkv pretrain --objective caption``).

    Unset (``None``) training settings come from the recipe (:meth:`resolved`).

    Attributes:
        out: the run folder. objective: ``"caption"``.
        preset: a recipe of :data:`CAPTION_RECIPES`; model: :class:`ModelConfig` overrides.
        data: training canvases, ``dataset:fashion-captions`` (its train split); the held-out
            canvases are its test split.
        label_smoothing: of the loss.
        eval_sample: held-out canvases captioned at each evaluation during training (all at the end).
        the rest: the training loop's (:class:`~qkv.training.loop_fields.RecipeLoopFields`).
    """

    out: str
    objective: str = "caption"
    preset: str = "caption-fashion"
    model: dict[str, Any] = field(default_factory=dict)
    data: str | None = None
    label_smoothing: float | None = None
    eval_sample: int = 500
    eval_batch_size: int = 250

    EXAMPLE_TOKENS = "tokens per canvas and caption"

    def __post_init__(self) -> None:
        check_field_types(self)
        object.__setattr__(self, "out", str(self.out))
        check_choice("objective", self.objective, ("caption",))
        if self.preset not in CAPTION_RECIPES:
            raise ValueError(f"unknown caption recipe (--preset) {self.preset!r}; allowed: {', '.join(CAPTION_RECIPES)}")
        if not isinstance(self.model, dict):
            raise ValueError(f"model overrides must be a dict of ModelConfig fields, got {self.model!r}")
        for name in ("eval_sample", "eval_batch_size"):
            check_int(name, getattr(self, name))
        if self.label_smoothing is not None:
            check_range("label_smoothing", self.label_smoothing, 0, 1)
        check_loop_values(self, minutes=" of minutes (e.g. 12)")
        self.check_loop_fields()

    def resolved(self) -> CaptionTrainConfig:
        """A copy with every unset setting taken from the recipe (``time_budget`` only when neither it
        nor ``steps`` is set)."""
        return dataclasses.replace(self, **self.recipe_changes(CAPTION_RECIPES[self.preset],
                                                               ("data", "label_smoothing")))

    def tokens_per_example(self, model: ModelConfig | None = None) -> int:
        """The tokens one training example is to the model: the canvas's image tokens (patches, +1 for
        [CLS]) and the caption's window (``max_len``) — of ``model`` (the run's, sized for the data), or
        before the data is read, of the recipe's model."""
        if model is None:
            image = CAPTION_RECIPES[self.preset]["model"]["image"]
            model = caption_model_config(self.preset, len(SPECIALS), tuple(image["size"]), image["channels"])
        return model.image.n_tokens + model.max_len

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
