"""The kinds of qkv model: what a model is (:func:`model_kind`) and building one of a kind (:func:`build_kind`).

A qkv model folder names its kind (``qkv.json`` ``kind``): ``encoder``, ``masked_lm``,
``sequence_classification``, ``token_classification``, ``discriminator``, ``causal_lm``,
``encoder_decoder``, and the image kinds ``image_encoder``, ``image_classification``,
``image_captioning`` (a config with an ``image`` section; :mod:`qkv.models.vision_builders`). Loading builds that kind from the config, and a model prepared for inference
is the same kind built again with other linear maps (:class:`~qkv.nn.maps.LinearMaps`).
"""

from __future__ import annotations

from torch import nn

from qkv.config import ModelConfig
from qkv.models.builders import (build_causal_lm, build_discriminator, build_encoder, build_encoder_decoder,
                                 build_model)
from qkv.models.causal_lm import CausalLM
from qkv.models.discriminator import Discriminator
from qkv.models.heads import TaskConfig
from qkv.models.task_models import TaskModel
from qkv.models.mlm import MaskedLM
from qkv.models.seq2seq import EncoderDecoder
from qkv.models.task_builders import build_task_model
from qkv.models.vision import ImageCaptioner, ImageClassifier
from qkv.models.vision_builders import build_image_captioner, build_image_classifier, build_vision_encoder
from qkv.nn.encoder import Encoder
from qkv.nn.maps import TRAINING, LinearMaps
from qkv.nn.vision_encoder import VisionEncoder

__all__ = ["KINDS", "IMAGE_KINDS", "kind_of", "model_kind", "build_kind", "encoder_of"]

#: The kinds (``qkv.json`` ``kind``), as the Hugging Face converters name them too.
#: The kinds whose input is an image (their config has an ``image`` section).
IMAGE_KINDS = ("image_encoder", "image_classification", "image_captioning")
KINDS = ("masked_lm", "encoder", "sequence_classification", "token_classification", "discriminator", "causal_lm",
         "encoder_decoder") + IMAGE_KINDS
_MODELS = (MaskedLM, Encoder, TaskModel, Discriminator, CausalLM, EncoderDecoder, VisionEncoder, ImageClassifier,
           ImageCaptioner)
_IMAGE_MODELS = {VisionEncoder: "image_encoder", ImageClassifier: "image_classification",
                 ImageCaptioner: "image_captioning"}


def kind_of(masked_lm: bool, task: TaskConfig | None) -> str:
    """The kind of an encoder-based model: a task kind with ``task``, else masked LM or encoder."""
    if task is not None:
        return "sequence_classification" if task.is_sequence else "token_classification"
    return "masked_lm" if masked_lm else "encoder"


def model_kind(model: nn.Module) -> tuple[ModelConfig, str, TaskConfig | None]:
    """``(config, kind, task)`` of a qkv model (``task`` for the task kinds and image classification,
    else ``None``)."""
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig) or not isinstance(model, _MODELS):
        raise ValueError("expected a qkv MaskedLM, CausalLM, Encoder, SequenceClassifier, TokenClassifier, "
                         "Discriminator or EncoderDecoder with a .config (build it with qkv.models.builders or "
                         f"qkv.load), got {type(model).__name__}")
    if type(model) in _IMAGE_MODELS:
        return config, _IMAGE_MODELS[type(model)], getattr(model, "task", None)
    if isinstance(model, Discriminator):
        return config, "discriminator", None
    if isinstance(model, CausalLM):
        return config, "causal_lm", None
    if isinstance(model, EncoderDecoder):
        return config, "encoder_decoder", None
    task = model.task if isinstance(model, TaskModel) else None
    return config, kind_of(isinstance(model, MaskedLM), task), task


def build_kind(config: ModelConfig, kind: str, task: TaskConfig | None = None, *, init: bool = False,
               maps: LinearMaps = TRAINING, causal: bool = False) -> nn.Module:
    """A model of ``kind`` (one of :data:`KINDS`) from ``config`` (and ``task`` for the task kinds);
    ``causal``: an ``encoder`` that is a decoder's stack."""
    if kind in IMAGE_KINDS:
        return _build_image(config, kind, task, init=init, maps=maps)
    if task is not None:
        return build_task_model(config, task, init=init, maps=maps)
    if kind == "discriminator":
        return build_discriminator(config, init=init, maps=maps)
    if kind == "causal_lm":
        return build_causal_lm(config, init=init, maps=maps)
    if kind == "encoder_decoder":
        return build_encoder_decoder(config, init=init, maps=maps)
    if kind not in ("encoder", "masked_lm"):
        raise ValueError(f"kind {kind!r} is not allowed; allowed: {', '.join(KINDS)}")
    if kind == "encoder":
        return build_encoder(config, init=init, maps=maps, causal=causal)
    return build_model(config, masked_lm=True, init=init, maps=maps)


def _build_image(config: ModelConfig, kind: str, task: TaskConfig | None, *, init: bool, maps: LinearMaps):
    if kind == "image_classification":
        if task is None:
            raise ValueError("kind 'image_classification' needs its task (labels, pooling)")
        return build_image_classifier(config, task, init=init, maps=maps)
    if kind == "image_captioning":
        return build_image_captioner(config, init=init, maps=maps)
    return build_vision_encoder(config, init=init, maps=maps)


def encoder_of(model: nn.Module) -> Encoder:
    """The :class:`~qkv.nn.encoder.Encoder` of a qkv model: itself, its ``encoder`` (the stack of a
    masked LM, a task model, a discriminator, an encoder–decoder's encoder) or its ``decoder`` (a
    causal LM's causal stack)."""
    if isinstance(model, Encoder):
        return model
    for name in ("encoder", "decoder"):
        stack = getattr(model, name, None)
        if isinstance(stack, Encoder):
            return stack
    raise ValueError(f"{type(model).__name__} has no qkv encoder; expected a qkv model (qkv.load, the builders)")
