"""What an image run depends on: :class:`ImageTrainConfig` (stored in ``run.json``; ``--resume``
refuses a different one) and the recipes (:data:`RECIPES`: a model and its training settings;
docs/vision.md says which were measured and what they reached).

A recipe's ``model`` is :class:`~qkv.config.ModelConfig` fields in the flat short names with an
``image`` section; ``--model`` overrides any of them (``{"image": {"patch": 7}}``, ``{"n_layers": 6}``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from qkv.config import ModelConfig
from qkv.training.config import RunConfig
from qkv.training.loop_fields import RecipeLoopFields, check_loop_values
from qkv.validation import check_choice, check_field_types, check_int, check_range

__all__ = ["ImageTrainConfig", "RECIPES", "AUGMENTATIONS", "OBJECTIVES", "model_config"]

#: The image objectives of the training command.
OBJECTIVES = ("image",)
#: What augmentation may do to a training image (:mod:`qkv.vision.augment`).
AUGMENTATIONS = ("flip", "shift", "erase")

_IMAGE_TEXT = dict(vocab_size=1, pad_token_id=None, type_vocab_size=0, norm="pre", dropout=0.0, position="none",
                   layer_norm_eps=1e-6, embedding_norm=False)

#: name → {model, training settings}. ``vit-fashion``: the best of three short sweeps (docs/vision.md:
#: width 128, patches of 7 pixels, 2-D sinusoidal positions, a stem of two 3×3 convolutions of 16
#: channels, mirroring only — shifts cost more than they gave in 15 minutes, learned positions learned
#: slower, the stem costs a quarter of the images/s and gives more than that back);
#: ``vit-mnist1d`` a starting point (docs/vision.md has what was measured); ``vit-digits`` is a
#: seconds-long run for tests and demos.
RECIPES: dict[str, dict[str, Any]] = {
    "vit-fashion": dict(
        model=dict(_IMAGE_TEXT, d_model=128, n_heads=4, d_ff=256, n_layers=4, max_len=50,
                   image=dict(size=[28, 28], channels=1, patch=7, position="sinusoidal-2d", stem=[16, 16])),
        data="dataset:fashion-mnist", batch_size=128, lr=2e-3, weight_decay=0.05, warmup_steps=200,
        schedule="cosine", augment=("flip",), label_smoothing=0.1, pooling="mean", time_budget=15.0),
    "vit-mnist1d": dict(
        model=dict(_IMAGE_TEXT, d_model=64, n_heads=4, d_ff=128, n_layers=4, max_len=40,
                   image=dict(size=[40], channels=1, patch=4, stride=2, position="learned")),
        data="dataset:mnist1d", batch_size=64, lr=2e-3, weight_decay=0.05, warmup_steps=100, schedule="cosine",
        augment=(), label_smoothing=0.0, pooling="mean", steps=3000),
    "vit-digits": dict(
        model=dict(_IMAGE_TEXT, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_len=17,
                   image=dict(size=[8, 8], channels=1, patch=4, position="learned")),
        data="dataset:digits", batch_size=64, lr=5e-3, weight_decay=0.01, warmup_steps=20, schedule="cosine",
        augment=(), label_smoothing=0.0, pooling="mean", steps=300),
}


def model_config(recipe: str, overrides: dict[str, Any] | None = None, **fields: Any) -> ModelConfig:
    """The :class:`ModelConfig` of ``recipe`` with ``overrides`` (flat names, sections, ``image``) and
    ``fields`` applied."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown image recipe {recipe!r}; allowed: {', '.join(RECIPES)}")
    base = ModelConfig.from_flat(**{**RECIPES[recipe]["model"], **fields})
    return base.replace(**overrides) if overrides else base


@dataclass(frozen=True)
class ImageTrainConfig(RecipeLoopFields, RunConfig):
    """An image-classification run (``objective="image"``; the only image objective so far).

    Unset (``None``) training settings come from the recipe (:meth:`resolved`).

    Attributes:
        out: the run folder. objective: one of :data:`OBJECTIVES`.
        preset: a recipe of :data:`RECIPES`; model: :class:`ModelConfig` overrides.
        data: training images: ``dataset:NAME[:SPLIT]`` or a folder with one sub-folder per class.
        eval_data: held-out images; default the named dataset's test split, else ``eval_fraction``
            of the folder (a seeded, stratified share).
        augment: training augmentations (:data:`AUGMENTATIONS`). label_smoothing: of the loss.
        pooling: ``cls``, ``mean`` or ``pooler`` (image classification).
        eval_sample: held-out images scored at each evaluation during training (the whole
            held-out set at the end).
        the rest: the training loop's (:class:`~qkv.training.loop_fields.RecipeLoopFields`).
    """

    out: str
    objective: str = "image"
    preset: str = "vit-fashion"
    model: dict[str, Any] = field(default_factory=dict)
    data: str | None = None
    eval_data: str | None = None
    eval_fraction: float = 0.1
    augment: tuple[str, ...] | None = None
    label_smoothing: float | None = None
    pooling: str | None = None
    eval_sample: int = 2000
    eval_batch_size: int = 500

    EXAMPLE_TOKENS = "tokens per image"

    def __post_init__(self) -> None:
        check_field_types(self)
        object.__setattr__(self, "out", str(self.out))
        check_choice("objective", self.objective, OBJECTIVES)
        if self.preset not in RECIPES:
            raise ValueError(f"unknown image recipe (--preset) {self.preset!r}; allowed: {', '.join(RECIPES)}")
        if not isinstance(self.model, dict):
            raise ValueError(f"model overrides must be a dict of ModelConfig fields, got {self.model!r}")
        if isinstance(self.augment, (list, str)):
            aug = self.augment.split(",") if isinstance(self.augment, str) else self.augment
            object.__setattr__(self, "augment", tuple(a for a in aug if a and a != "none"))
        for a in self.augment or ():
            check_choice("augment", a, AUGMENTATIONS)
        check_choice("pooling", self.pooling, ("cls", "mean", "pooler"), optional=True)
        for name in ("eval_sample", "eval_batch_size"):
            check_int(name, getattr(self, name))
        check_range("eval_fraction", self.eval_fraction, 0, 1, bounds="()")
        if self.label_smoothing is not None:
            check_range("label_smoothing", self.label_smoothing, 0, 1)
        check_loop_values(self, minutes=" of minutes (e.g. 15)")
        self.check_loop_fields()

    def resolved(self) -> ImageTrainConfig:
        """A copy with every unset setting taken from the recipe (``time_budget`` only when neither it
        nor ``steps`` is set)."""
        return dataclasses.replace(self, **self.recipe_changes(RECIPES[self.preset],
                                                               ("data", "augment", "label_smoothing", "pooling")))

    def tokens_per_example(self, model: ModelConfig | None = None) -> int:
        """The tokens one image is to the model: its patches, +1 for [CLS] — of ``model`` (the run's,
        sized for the data), or before the data is read, of the recipe's model."""
        return (model or model_config(self.preset)).image.n_tokens

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["augment"] = None if self.augment is None else list(self.augment)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImageTrainConfig:
        cls.check_keys(data)
        data = dict(data)
        if isinstance(data.get("augment"), list):
            data["augment"] = tuple(data["augment"])
        return cls(**data)
