"""Hugging Face ViT ⇄ qkv (``model_type: vit``): ``ViTModel`` and ``ViTForImageClassification``.

Legend: C hidden size, F intermediate size, K channels, p × q patch, T = 1 + patches, L labels.

ViT is a pre-LN encoder over patches: a [CLS] vector, a learned table of T positions, the patch
embedding (a ``Conv2d`` with kernel = stride = patch, stored ``(C, K, p, q)``; qkv's is the same map
flattened, ``(C, K·p·q)``), layers with ``layernorm_before`` / ``layernorm_after``, a final
``layernorm``, and in ``ViTModel`` a pooler (``tanh(dense(h[:, 0]))``). The query/key/value maps are
fused into qkv's one ``qkv_proj``. ``ViTForImageClassification`` classifies the [CLS] state after the
final norm (qkv: pooling ``cls``, no classifier dropout).

Tensor names are transformers' saved names (``encoder.layer.N.attention.attention.query`` …); the
module names of transformers ≥ 5 (``layers.N.attention.q_proj`` …) are read too. Refused, never
dropped: ``ViTForMaskedImageModeling``, ``qkv_bias=False``, a pooler wider than the model or not
``tanh``, and any other tensor.
"""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from qkv.checkpoints.families._common import (
    ACT_TO_HF,
    Imported,
    Plan,
    activation_from_hf,
    architectures,
    check_plan,
    label_fields,
    labels_from_hf,
    refuse_unexpressible,
    state_from_plan,
    tensors_from_plan,
)
from qkv.config import ModelConfig
from qkv.errors import CheckpointError
from qkv.models.heads import TaskConfig

MODEL_TYPE = "vit"
NAME = "ViT"
ARCHITECTURES = {"image_encoder": "ViTModel", "image_classification": "ViTForImageClassification"}
FIELDS = {"C": "hidden_size", "F": "intermediate_size", "T": "image_size / patch_size", "L": "num_labels",
          "P": "num_channels · patch_size²", "O": "1"}
_PATCH_HF, _PATCH = "embeddings.patch_embeddings.projection.", "embeddings.patches.proj."
_POS_HF, _POS = "embeddings.position_embeddings", "embeddings.positions.weight"
EMBEDDINGS = [("embeddings.cls_token", "embeddings.cls", "OOC"), (_POS_HF, _POS, "OTC"),
              (_PATCH_HF + "weight", _PATCH + "weight", "CP"), (_PATCH_HF + "bias", _PATCH + "bias", "C")]
LAYER = [
    ("layernorm_before.weight", "norm1.weight", "C"), ("layernorm_before.bias", "norm1.bias", "C"),
    ("attention.output.dense.weight", "attention.out_proj.weight", "CC"),
    ("attention.output.dense.bias", "attention.out_proj.bias", "C"),
    ("layernorm_after.weight", "norm2.weight", "C"), ("layernorm_after.bias", "norm2.bias", "C"),
    ("intermediate.dense.weight", "feed_forward.linear1.weight", "FC"),
    ("intermediate.dense.bias", "feed_forward.linear1.bias", "F"),
    ("output.dense.weight", "feed_forward.linear2.weight", "CF"),
    ("output.dense.bias", "feed_forward.linear2.bias", "C"),
]
FINAL = [("layernorm.weight", "final_norm.weight", "C"), ("layernorm.bias", "final_norm.bias", "C")]
POOLER = [("pooler.dense.weight", "pooler.dense.weight", "CC"), ("pooler.dense.bias", "pooler.dense.bias", "C")]
CLASSIFIER = [("classifier.weight", "classifier.weight", "LC"), ("classifier.bias", "classifier.bias", "L")]
_REFUSED = {"ViTForMaskedImageModeling": "a masked-image-modelling decoder"}
SUPPORTED = "ViTModel and ViTForImageClassification (single-label)"
#: transformers ≥ 5 module names → the saved names
_NEW_NAMES = [(r"(^|\.)layers\.(\d+)\.", r"\1encoder.layer.\2."), (r"attention\.q_proj\.", "attention.attention.query."),
              (r"attention\.k_proj\.", "attention.attention.key."), (r"attention\.v_proj\.", "attention.attention.value."),
              (r"attention\.o_proj\.", "attention.output.dense."), (r"mlp\.fc1\.", "intermediate.dense."),
              (r"mlp\.fc2\.", "output.dense.")]


def _saved_name(name: str) -> str:
    for pattern, repl in _NEW_NAMES:
        name = re.sub(pattern, repl, name)
    return name


def _pair(value: Any, key: str, source: str) -> list[int]:
    pair = list(value) if isinstance(value, (list, tuple)) else [value, value]
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pair):
        raise CheckpointError(f"{source}: {key}={value!r} must be a positive int or a pair of them")
    return pair


def vit_config(hf: dict[str, Any], source: str, *, pooler: bool) -> ModelConfig:
    """A :class:`ModelConfig` (with its ``image`` section) from a ViT ``config.json``."""
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size") if k not in hf]
    if missing:
        raise CheckpointError(f"{source}: missing field(s) {missing}")
    if not hf.get("qkv_bias", True):
        raise CheckpointError(f"{source}: qkv_bias=False is not supported (qkv's attention maps have biases "
                              "throughout); keep the model in transformers")
    if hf.get("pooler_output_size") not in (None, hf["hidden_size"]) or hf.get("pooler_act", "tanh") != "tanh":
        raise CheckpointError(f"{source}: pooler_output_size={hf.get('pooler_output_size')!r} / pooler_act="
                              f"{hf.get('pooler_act')!r}: qkv's pooler is hidden_size wide with tanh")
    size, patch = _pair(hf.get("image_size", 224), "image_size", source), _pair(hf.get("patch_size", 16), "patch_size", source)
    if any(s % p for s, p in zip(size, patch)):
        raise CheckpointError(f"{source}: image_size={size} is not divisible by patch_size={patch}; transformers "
                              "would drop the last pixels, which qkv refuses")
    try:
        image = dict(size=size, channels=int(hf.get("num_channels", 3)), patch=patch, cls_token=True,
                     position="learned")
        n_tokens = 1 + (size[0] // patch[0]) * (size[1] // patch[1])
        return ModelConfig.from_flat(
            vocab_size=1, pad_token_id=None, type_vocab_size=0, d_model=hf["hidden_size"],
            n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"], n_layers=hf["num_hidden_layers"],
            max_len=n_tokens, activation=activation_from_hf(hf.get("hidden_act", "gelu"), source), norm="pre",
            dropout=float(hf.get("hidden_dropout_prob", 0.0)),
            attention_dropout=float(hf.get("attention_probs_dropout_prob", 0.0)),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)), embedding_norm=False,
            initializer_range=float(hf.get("initializer_range", 0.02)), pooler=pooler, family=MODEL_TYPE,
            image=image)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def _plan(config: ModelConfig, kind: str, task: TaskConfig | None, prefix: str) -> Plan:
    image = config.image
    dims = {"C": config.d_model, "F": config.ffn.d_ff, "T": image.n_tokens, "P": image.patch_dim, "O": 1,
            "L": task.num_labels if task is not None else 0}
    plan = Plan(dims, FIELDS)
    enc = "" if kind == "image_encoder" else "encoder."
    plan.rows += [(prefix + hf, enc + ours, sym) for hf, ours, sym in EMBEDDINGS + FINAL]
    for i in range(config.n_layers):
        hf_layer, layer = f"{prefix}encoder.layer.{i}.", f"{enc}layers.{i}."
        plan.rows += [(hf_layer + hf, layer + ours, sym) for hf, ours, sym in LAYER]
        for p, sym in (("weight", "CC"), ("bias", "C")):
            parts = tuple(f"{hf_layer}attention.attention.{n}.{p}" for n in ("query", "key", "value"))
            plan.fused.append((f"{layer}attention.qkv_proj.{p}", parts, sym))
    if config.pooler:
        plan.rows += [(prefix + hf, enc + ours, sym) for hf, ours, sym in POOLER]
    if task is not None:
        plan.rows += CLASSIFIER
    return plan


def _kind_and_task(hf: dict[str, Any], names: set[str], source: str) -> tuple[str, TaskConfig | None]:
    archs = architectures(hf)
    for arch in archs:
        if arch in _REFUSED:
            raise CheckpointError(f"{source}: {arch}: {_REFUSED[arch]} is not supported; qkv loads {SUPPORTED}, "
                                  "and never drops a head silently")
    known = {a: k for k, a in ARCHITECTURES.items()}
    if len(archs) > 1 or (archs and archs[0] not in known):
        raise CheckpointError(f"{source}: architectures={archs!r} is not supported; qkv loads {SUPPORTED}")
    classifier = any(n.startswith("classifier.") for n in names)
    kind = known[archs[0]] if archs else ("image_classification" if classifier else "image_encoder")
    if kind == "image_encoder":
        return kind, None
    if hf.get("problem_type") not in (None, "single_label_classification"):
        raise CheckpointError(f"{source}: problem_type={hf.get('problem_type')!r} is not supported; qkv classifies "
                              "one label per image (single_label_classification)")
    try:
        return kind, TaskConfig("sequence-classification", labels_from_hf(hf, source), pooling="cls",
                                classifier_dropout=0.0)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def read(hf: dict[str, Any], tensors: dict[str, Tensor], *, config_source: str, weights_source: str) -> Imported:
    """A Hugging Face ViT checkpoint (``config.json`` dict and tensors) as qkv's config, kind, task and
    state dict (the position table ``(1,T,C) → (T,C)``, the patch kernel ``(C,K,p,q) → (C,K·p·q)``)."""
    tensors = {_saved_name(k): v for k, v in tensors.items()}
    kind, task = _kind_and_task(hf, set(tensors), config_source)
    prefix = "vit." if any(n.startswith("vit.") for n in tensors) else ""
    config = vit_config(hf, config_source, pooler=any(n.startswith(prefix + "pooler.") for n in tensors))
    plan = _plan(config, kind, task, prefix)
    weight = tensors.get(prefix + _PATCH_HF + "weight")
    if weight is not None and weight.dim() == 4:  # the conv kernel, flattened as qkv stores it
        tensors[prefix + _PATCH_HF + "weight"] = weight.reshape(weight.shape[0], -1)
    check_plan(tensors, plan, weights_source, ignored=(prefix + "embeddings.mask_token",),
               owned=(prefix + "embeddings.", prefix + "encoder.", prefix + "layernorm.", prefix + "pooler.",
                      "classifier."),
               layers_field="num_hidden_layers", n_layers=config.n_layers, pooler=prefix + "pooler.",
               unknown=f"a ViT encoder, its pooler, or a head qkv supports ({SUPPORTED})")
    state = state_from_plan(tensors, plan)
    enc = "" if kind == "image_encoder" else "encoder."
    state[enc + _POS] = state[enc + _POS].reshape(config.image.n_tokens, config.d_model)  # (1,T,C) -> (T,C)
    state[enc + "embeddings.cls"] = state[enc + "embeddings.cls"].reshape(1, 1, config.d_model)
    return Imported(config, kind, task, state)


def config_to_hf(config: ModelConfig, kind: str, task: TaskConfig | None = None) -> dict[str, Any]:
    """The ``config.json`` of a qkv image model as a Hugging Face ViT; raises :class:`CheckpointError`
    naming every option ViT cannot express."""
    image, extra = config.image, []
    if image is None:
        raise CheckpointError(f"a text model (kind {kind!r}) cannot be exported as a Hugging Face ViT; choose its "
                              "own family")
    if kind not in ARCHITECTURES:
        extra.append(f"kind {kind!r} (ViT has {', '.join(ARCHITECTURES)})")
    if len(image.size) != 2:
        extra.append(f"image.size={image.size} (ViT reads 2-D images)")
    if image.stride not in (None, image.patch):
        extra.append(f"image.stride={image.stride} (ViT's patches do not overlap: needs stride = patch)")
    if not image.cls_token:
        extra.append("image.cls_token=False (ViT has a [CLS] token)")
    if image.stem:
        extra.append(f"image.stem={list(image.stem)} (ViT cuts its patches from the pixels: needs no stem)")
    if image.position != "learned":
        extra.append(f"image.position={image.position!r} (ViT needs 'learned')")
    if task is not None and task.pooling != "cls":
        extra.append(f"pooling={task.pooling!r} (ViTForImageClassification classifies the [CLS] state: needs 'cls')")
    anything = (lambda c: True, "anything")
    refuse_unexpressible(config, NAME, {"norm": "pre", "embedding_norm": anything, "position": anything,
                                        "embedding_size": None, "position_offset": 0}, extra)
    out = {
        "architectures": [ARCHITECTURES[kind]], "model_type": MODEL_TYPE, "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers, "num_attention_heads": config.attention.n_heads,
        "intermediate_size": config.ffn.d_ff, "hidden_act": ACT_TO_HF[config.ffn.activation],
        "hidden_dropout_prob": config.dropout, "attention_probs_dropout_prob": config.attention.dropout,
        "initializer_range": config.initializer_range, "layer_norm_eps": config.norm.eps,
        "image_size": list(image.size), "patch_size": list(image.patch), "num_channels": image.channels,
        "qkv_bias": True, "encoder_stride": image.patch[0], "pooler_output_size": config.d_model, "pooler_act": "tanh",
    }
    if task is not None:
        out.update(label_fields(task), problem_type="single_label_classification")
    return out


def write(state: dict[str, Tensor], config: ModelConfig, kind: str,
          task: TaskConfig | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json dict, tensors)`` of the Hugging Face ViT checkpoint of a qkv image model."""
    hf = config_to_hf(config, kind, task)
    prefix = "" if kind == "image_encoder" else "vit."
    tensors = tensors_from_plan(state, _plan(config, kind, task, prefix))
    image, C = config.image, config.d_model
    tensors[prefix + _POS_HF] = tensors[prefix + _POS_HF].reshape(1, image.n_tokens, C).contiguous()
    kernel = tensors[prefix + _PATCH_HF + "weight"]
    tensors[prefix + _PATCH_HF + "weight"] = kernel.reshape(C, image.channels, *image.patch).contiguous()
    return hf, tensors
