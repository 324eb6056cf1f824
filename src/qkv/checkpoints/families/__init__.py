"""Hugging Face model families ⇄ qkv: one converter module per family, chosen by ``model_type``.

These modules are the only code that knows Hugging Face tensor and config names. Each family
module (``bert``, ``roberta``, ``distilbert``, ``electra``, ``modernbert``, ``gpt2``, ``vit``; the
encoder–decoders ``marian``, ``bart``, ``t5``) offers the same
three things:

* ``read(hf_config, tensors, *, config_source, weights_source) -> Imported`` — qkv's config
  (with ``family`` set to the module's ``MODEL_TYPE``), kind, task and state dict, every tensor
  checked for presence and shape and any other tensor refused;
* ``config_to_hf(config, kind, task)`` — the ``config.json`` dict, or a
  :class:`~qkv.errors.CheckpointError` naming every field the family cannot express;
* ``write(state, config, kind, task) -> (config.json dict, tensors)``;
* ``SEQUENCE_HEAD`` / ``TOKEN_HEAD`` (encoder families): the shape of the family's classification
  heads in :class:`~qkv.models.heads.TaskConfig` fields (``pooling``, ``head``, ``head_norm``; a tuple
  allows any of its values) — :func:`task_head` gives the one a fresh head gets.

:data:`FAMILIES` maps ``model_type`` to the module; adding a family is one module and one entry.
A model remembers the family it came from in ``ModelConfig.family`` (saved in ``qkv.json``), and
:func:`for_export` writes it back as that family; a qkv model (``family=None``) exports as BERT
(a causal LM as GPT-2, an encoder–decoder as Marian, an image model as ViT).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from qkv.errors import CheckpointError

__all__ = ["FAMILIES", "for_checkpoint", "for_export", "get", "check_family", "task_head"]

#: ``config.json`` ``model_type`` → the converter module (imported on first use).
FAMILIES: dict[str, str] = {
    "bert": "qkv.checkpoints.families.bert",
    "roberta": "qkv.checkpoints.families.roberta",
    "distilbert": "qkv.checkpoints.families.distilbert",
    "electra": "qkv.checkpoints.families.electra",
    "modernbert": "qkv.checkpoints.families.modernbert",
    "gpt2": "qkv.checkpoints.families.gpt2",
    "marian": "qkv.checkpoints.families.marian",
    "bart": "qkv.checkpoints.families.bart",
    "t5": "qkv.checkpoints.families.t5",
    "vit": "qkv.checkpoints.families.vit",
}
DEFAULT = "bert"


def check_family(config) -> None:
    """:class:`CheckpointError` unless ``config.family`` is ``None`` (a qkv model) or a family qkv converts."""
    if config.family is not None and config.family not in FAMILIES:
        raise CheckpointError(f"family={config.family!r} is not allowed; allowed: {', '.join(FAMILIES)} "
                              "(or none: a qkv model, exported as BERT)")


def get(name: str) -> ModuleType:
    """The converter module of family ``name`` (a key of :data:`FAMILIES`)."""
    if name not in FAMILIES:
        raise CheckpointError(f"unknown model family {name!r}; qkv converts: {', '.join(FAMILIES)}")
    return importlib.import_module(FAMILIES[name])


def for_checkpoint(hf_config: dict[str, Any], source: str) -> ModuleType:
    """The converter of a Hugging Face ``config.json`` dict, by its ``model_type``.

    Raises:
        CheckpointError: a ``model_type`` qkv does not convert, named with the supported ones.
    """
    model_type = hf_config.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(f"{source}: not a BERT checkpoint (model_type is {model_type!r}, expected "
                              "'bert') nor of another family qkv converts; supported model_type values: "
                              f"{', '.join(FAMILIES)}")
    return get(model_type)


def task_head(config, sequence: bool) -> dict[str, Any]:
    """The :class:`~qkv.models.heads.TaskConfig` fields (``pooling``, ``head``, ``head_norm``) of a fresh
    task head in the shape of ``config``'s family (BERT's for a qkv model), so that the fine-tuned
    model writes back as that family's ``…ForSequenceClassification`` / ``…ForTokenClassification``;
    where the family allows several values, the model's own activation or the first."""
    module = get(config.family if config.family in FAMILIES else DEFAULT)
    shape = getattr(module, "SEQUENCE_HEAD" if sequence else "TOKEN_HEAD", None) or get(DEFAULT).SEQUENCE_HEAD
    out = {}
    for key, value in shape.items():
        if isinstance(value, tuple):
            value = config.ffn.activation if key == "head" and config.ffn.activation in value else value[0]
        out[key] = value
    if not sequence:
        out.pop("pooling", None)
    return out


def for_export(config, family: str | None = None, kind: str | None = None) -> ModuleType:
    """The converter a qkv model exports with: ``family`` if given, else ``config.family``, else
    GPT-2 for a causal LM (``kind="causal_lm"``), Marian for an encoder–decoder, ViT for an image model and
    BERT for the rest."""
    own = {"causal_lm": "gpt2", "encoder_decoder": "marian"}.get(kind)
    if own is None:
        own = "vit" if getattr(config, "image", None) is not None else DEFAULT
    return get(family or config.family or own)
