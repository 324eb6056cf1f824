"""Hugging Face BERT ⇄ qkv conversion. The only module that knows Hugging Face tensor names.

Legend: C hidden size, F intermediate size, V vocabulary, P position table size, S segment ids.

Config fields map one to one (``hidden_size`` → ``d_model``, …). Tensors map by name, except the
separate query/key/value maps, which qkv fuses into one ``qkv_proj`` with rows ``[q; k; v]``.

Kept on import: the embeddings and layers, the pooler (``pooler.dense.*``: the config gets
``pooler=True``), the masked-LM head (``cls.predictions.*``; its decoder weight must equal the
word embeddings: tied), and the classifier (``classifier.*``) of ``BertForSequenceClassification``
(single-label classification or regression, as transformers decides from ``problem_type`` and
``num_labels``) and ``BertForTokenClassification``, with the class names of ``id2label``.
Ignored: position/token-type id buffers and the next-sentence head (``cls.seq_relationship.*``)
of ``BertForPreTraining`` checkpoints. Refused (never dropped silently): question answering,
multiple choice, multi-label classification, a classifier without an architecture saying which,
and any other tensor. Every kept tensor is checked for presence and shape against
``config.json`` before anything is copied.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from qkv.config import ModelConfig
from qkv.models.errors import CheckpointError
from qkv.models.heads import TaskConfig

__all__ = ["config_from_hf", "config_to_hf", "state_dict_from_hf", "state_dict_to_hf", "has_mlm_head",
           "has_pooler", "head_from_hf"]

_ACT_FROM_HF = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
_ACT_TO_HF = {"gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_pytorch_tanh"}
_DIM_FIELDS = {"C": "hidden_size", "F": "intermediate_size", "V": "vocab_size",
               "P": "max_position_embeddings", "S": "type_vocab_size", "L": "num_labels"}

_HEAD = "cls.predictions."
#: (Hugging Face name relative to the encoder, qkv name relative to the encoder, symbolic shape)
_EMBEDDINGS = [
    ("embeddings.word_embeddings.weight", "embeddings.tokens.weight", "VC"),
    ("embeddings.position_embeddings.weight", "embeddings.positions.weight", "PC"),
    ("embeddings.token_type_embeddings.weight", "embeddings.segments.weight", "SC"),
    ("embeddings.LayerNorm.weight", "embeddings.norm.weight", "C"),
    ("embeddings.LayerNorm.bias", "embeddings.norm.bias", "C"),
]
_LAYER = [  # the query/key/value maps are handled apart (fused)
    ("attention.output.dense.weight", "attention.out_proj.weight", "CC"),
    ("attention.output.dense.bias", "attention.out_proj.bias", "C"),
    ("attention.output.LayerNorm.weight", "norm1.weight", "C"),
    ("attention.output.LayerNorm.bias", "norm1.bias", "C"),
    ("intermediate.dense.weight", "feed_forward.linear1.weight", "FC"),
    ("intermediate.dense.bias", "feed_forward.linear1.bias", "F"),
    ("output.dense.weight", "feed_forward.linear2.weight", "CF"),
    ("output.dense.bias", "feed_forward.linear2.bias", "C"),
    ("output.LayerNorm.weight", "norm2.weight", "C"),
    ("output.LayerNorm.bias", "norm2.bias", "C"),
]
_QKV = [(f"attention.self.{n}.{p}", "CC" if p == "weight" else "C") for p in ("weight", "bias")
        for n in ("query", "key", "value")]
_MLM = [
    (_HEAD + "transform.dense.weight", "head.dense.weight", "CC"),
    (_HEAD + "transform.dense.bias", "head.dense.bias", "C"),
    (_HEAD + "transform.LayerNorm.weight", "head.norm.weight", "C"),
    (_HEAD + "transform.LayerNorm.bias", "head.norm.bias", "C"),
    (_HEAD + "bias", "head.bias", "V"),
]
_POOLER = [("pooler.dense.weight", "pooler.dense.weight", "CC"), ("pooler.dense.bias", "pooler.dense.bias", "C")]
_CLASSIFIER = [("classifier.weight", "classifier.weight", "LC"), ("classifier.bias", "classifier.bias", "L")]
_IGNORED_ENCODER = ("embeddings.position_ids", "embeddings.token_type_ids")
_NSP = "cls.seq_relationship."  # BertForPreTraining's next-sentence head: tolerated, ignored
_SEQUENCE, _TOKEN = "BertForSequenceClassification", "BertForTokenClassification"
_NO_HEAD = ("BertModel", "BertForMaskedLM", "BertForPreTraining", "BertForNextSentencePrediction")
_REFUSED = {"BertForQuestionAnswering": "a question-answering head (qa_outputs.*)",
            "BertForMultipleChoice": "a multiple-choice head"}
_SUPPORTED = ("BertModel, BertForMaskedLM, BertForPreTraining (its next-sentence head ignored), "
              "BertForSequenceClassification (single-label or regression) and BertForTokenClassification")


def config_from_hf(hf: dict[str, Any], *, source: str = "config.json", pooler: bool = False) -> ModelConfig:
    """A :class:`ModelConfig` from a Hugging Face BERT ``config.json`` dict; ``pooler``: whether
    the checkpoint has a pooler (:func:`has_pooler` of its tensors), which the config cannot say."""
    if hf.get("model_type") != "bert":
        raise CheckpointError(f"{source}: model_type is {hf.get('model_type')!r}, expected 'bert'")
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                           "intermediate_size") if k not in hf]
    if missing:
        raise CheckpointError(f"{source}: missing field(s) {missing}")
    unsupported = {"is_decoder": False, "add_cross_attention": False, "position_embedding_type": "absolute"}
    for key, want in unsupported.items():
        if hf.get(key, want) != want:
            raise CheckpointError(f"{source}: {key}={hf[key]!r} is not supported; expected {want!r}")
    act = hf.get("hidden_act", "gelu")
    if act not in _ACT_FROM_HF:
        raise CheckpointError(
            f"{source}: hidden_act={act!r} is not supported; allowed: {', '.join(_ACT_FROM_HF)}")
    try:
        return ModelConfig(
            vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_heads=hf["num_attention_heads"],
            d_ff=hf["intermediate_size"], n_layers=hf["num_hidden_layers"],
            max_len=hf.get("max_position_embeddings", 512), type_vocab_size=hf.get("type_vocab_size", 2),
            activation=_ACT_FROM_HF[act], norm="post", dropout=float(hf.get("hidden_dropout_prob", 0.1)),
            attention_dropout=float(hf.get("attention_probs_dropout_prob", 0.1)), position="learned",
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            pad_token_id=hf.get("pad_token_id") or 0,
            initializer_range=float(hf.get("initializer_range", 0.02)),
            pooler=pooler,
        )
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def config_to_hf(config: ModelConfig, *, masked_lm: bool, task: TaskConfig | None = None) -> dict[str, Any]:
    """A Hugging Face BERT ``config.json`` dict (of ``BertForMaskedLM`` if ``masked_lm``, of
    ``BertForSequenceClassification`` / ``BertForTokenClassification`` with ``task``, else of
    ``BertModel``); raises if the model is not expressible in BERT."""
    bert = {"position": "learned", "position_qk_only": False, "similarity": "scaled_dot",
            "similarity_kwargs": {}, "qkv_proj": True, "out_proj": True, "attention_bias": True,
            "norm": "post"}
    bad = [f"{k}={getattr(config, k)!r} (BERT needs {v!r})"
           for k, v in bert.items() if getattr(config, k) != v]
    if config.type_vocab_size < 1:
        bad.append("type_vocab_size=0 (BERT needs ≥ 1)")
    if task is not None and task.is_sequence and task.pooling != "pooler":
        bad.append(f"pooling={task.pooling!r} ({_SEQUENCE} classifies the BERT pooler's output: needs 'pooler')")
    if bad:
        raise CheckpointError("this model cannot be exported as a Hugging Face BERT: " + "; ".join(bad)
                              + "; keep it in the qkv format (qkv.save)")
    arch = "BertForMaskedLM" if masked_lm else "BertModel"
    out = {
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "intermediate_size": config.d_ff,
        "hidden_act": _ACT_TO_HF[config.activation],
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_len,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_token_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }
    if task is not None:
        arch = _SEQUENCE if task.is_sequence else _TOKEN
        names = task.labels or ("LABEL_0",)  # regression: transformers' default name of its one output
        out["id2label"] = {str(i): name for i, name in enumerate(names)}
        out["label2id"] = {name: i for i, name in enumerate(names)}
        out["classifier_dropout"] = task.classifier_dropout
        if task.is_sequence:
            out["problem_type"] = "regression" if task.task == "regression" else "single_label_classification"
    return {"architectures": [arch], **out}


def _prefix(names) -> str:
    return "bert." if any(n.startswith("bert.") for n in names) else ""


def has_mlm_head(names) -> bool:
    """Whether a set of Hugging Face tensor names includes the masked-LM head."""
    return any(n.startswith(_HEAD + "transform.") for n in names)


def has_pooler(names) -> bool:
    """Whether a set of Hugging Face tensor names includes the pooler (with or without ``bert.``)."""
    return any(n.startswith(("pooler.dense.", "bert.pooler.dense.")) for n in names)


def _labels_from_hf(hf: dict[str, Any], source: str) -> tuple[str, ...]:
    """Class names in id order from ``id2label`` (checked against ``label2id`` and ``num_labels``)."""
    id2label = hf.get("id2label")
    if id2label is None:
        return tuple(f"LABEL_{i}" for i in range(int(hf.get("num_labels", 2))))
    try:
        by_id = {int(k): v for k, v in dict(id2label).items()}
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: id2label={id2label!r} must map ids 0…L-1 to class names") from e
    if sorted(by_id) != list(range(len(by_id))) or not all(isinstance(v, str) for v in by_id.values()):
        raise CheckpointError(f"{source}: id2label={id2label!r} must map ids 0…L-1 to class names")
    labels = tuple(by_id[i] for i in range(len(by_id)))
    if "num_labels" in hf and hf["num_labels"] != len(labels):
        raise CheckpointError(f"{source}: num_labels={hf['num_labels']!r} disagrees with id2label "
                              f"({len(labels)} labels); fix one of them")
    label2id = hf.get("label2id")
    if label2id is not None and dict(label2id) != {name: i for i, name in enumerate(labels)}:
        raise CheckpointError(f"{source}: label2id={label2id!r} disagrees with id2label={id2label!r}; fix one "
                              "so that label2id[id2label[i]] == i")
    return labels


def head_from_hf(hf: dict[str, Any], names, *, source: str = "config.json") -> tuple[bool, TaskConfig | None]:
    """The head of a Hugging Face BERT checkpoint: ``(masked_lm, task)`` from its ``config.json``
    dict and tensor names; ``(False, None)`` for a bare encoder.

    Raises:
        CheckpointError: a head qkv does not support (named), or tensors and architectures that
            disagree; qkv never drops a head silently.
    """
    names = set(names)
    archs = hf.get("architectures") or []
    archs = list(archs) if isinstance(archs, (list, tuple)) else [archs]
    refused = [a for a in archs if a in _REFUSED]
    if refused or any(n.startswith("qa_outputs.") for n in names):
        what = f"{refused[0]}: {_REFUSED[refused[0]]}" if refused else _REFUSED["BertForQuestionAnswering"]
        raise CheckpointError(f"{source}: {what} is not supported; qkv loads {_SUPPORTED}, and never drops "
                              "a head silently")
    heads = [a for a in archs if a in (_SEQUENCE, _TOKEN)]
    masked_lm = has_mlm_head(names)
    classifier = sorted(n for n in names if n.startswith("classifier."))
    if not heads:
        if classifier:
            raise CheckpointError(f"{source}: the weights hold a classifier head ({classifier[0]!r}) but "
                                  f"architectures={archs!r} does not say which; qkv loads the classifier of "
                                  f"{_SEQUENCE} and {_TOKEN} only, and does not guess a head or drop it")
        return masked_lm, None
    if len(archs) > 1:
        raise CheckpointError(f"{source}: architectures={archs!r} names more than one model; expected one")
    if masked_lm:
        raise CheckpointError(f"{source}: {archs[0]} weights also hold a masked-LM head "
                              f"({_HEAD}*); a qkv model has one head")
    labels = _labels_from_hf(hf, source)
    dropout = hf.get("classifier_dropout")
    dropout = float(hf.get("hidden_dropout_prob", 0.1) if dropout is None else dropout)
    try:
        if archs[0] == _TOKEN:
            return False, TaskConfig("token-classification", labels, classifier_dropout=dropout)
        problem = hf.get("problem_type")
        if problem == "multi_label_classification":
            raise CheckpointError(f"{source}: problem_type='multi_label_classification' is not supported "
                                  "(qkv classifies one label per sequence, or regresses one value)")
        if problem not in (None, "single_label_classification", "regression"):
            raise CheckpointError(f"{source}: problem_type={problem!r} is not supported; allowed: "
                                  "single_label_classification, regression")
        if problem == "regression" or (problem is None and len(labels) == 1):
            if len(labels) != 1:
                raise CheckpointError(f"{source}: regression with num_labels={len(labels)} (several outputs) "
                                      "is not supported; qkv regresses one value")
            return False, TaskConfig("regression", (), classifier_dropout=dropout)
        return False, TaskConfig("sequence-classification", labels, classifier_dropout=dropout)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def _rename_legacy(name: str) -> str:
    """TF-converted checkpoints name LayerNorm parameters gamma/beta."""
    if "LayerNorm." in name:
        return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
    return name


def _expected(config: ModelConfig, masked_lm: bool, task: TaskConfig | None, prefix: str) -> dict[str, str]:
    """Hugging Face name → symbolic shape, for every tensor the conversion needs."""
    out = {prefix + hf: shape for hf, _, shape in _EMBEDDINGS}
    for i in range(config.n_layers):
        for hf, shape in _QKV:
            out[f"{prefix}encoder.layer.{i}.{hf}"] = shape
        for hf, _, shape in _LAYER:
            out[f"{prefix}encoder.layer.{i}.{hf}"] = shape
    if config.pooler:
        out.update({prefix + hf: shape for hf, _, shape in _POOLER})
    if masked_lm:
        out.update({hf: shape for hf, _, shape in _MLM})
    if task is not None:
        out.update({hf: shape for hf, _, shape in _CLASSIFIER})
    return out


def _check(tensors: dict[str, Tensor], config: ModelConfig, masked_lm: bool, task: TaskConfig | None,
           prefix: str, source: str):
    dims = {"C": config.d_model, "F": config.d_ff, "V": config.vocab_size, "P": config.max_len,
            "S": config.type_vocab_size, "L": task.num_labels if task is not None else 0}
    expected = _expected(config, masked_lm, task, prefix)
    for name, sym in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{source}: missing tensor {name!r} (expected shape "
                                  f"{tuple(dims[d] for d in sym)}, from config.json)")
        want = tuple(dims[d] for d in sym)
        got = tuple(tensors[name].shape)
        if got != want:
            fields = ", ".join(f"{_DIM_FIELDS[d]}={dims[d]}" for d in dict.fromkeys(sym))
            raise CheckpointError(f"{source}: tensor {name!r} has shape {got}, expected {want} "
                                  f"from config.json ({fields})")
    ours = (prefix + "embeddings.", prefix + "encoder.", prefix + "pooler.", _HEAD, "classifier.")
    ignored = tuple(prefix + n for n in _IGNORED_ENCODER) + (_HEAD + "decoder.", _NSP)
    for name in sorted(tensors):
        if name in expected or name.startswith(ignored):
            continue
        if name.startswith(prefix + "pooler."):
            raise CheckpointError(f"{source}: unexpected tensor {name!r}: the config has no pooler "
                                  "(ModelConfig.pooler=False); qkv.load sets it when the weights hold one")
        if name.startswith(ours):
            raise CheckpointError(
                f"{source}: unexpected tensor {name!r} for config.json (num_hidden_layers="
                f"{config.n_layers}); the config disagrees with the weights")
        raise CheckpointError(f"{source}: unknown tensor {name!r}: not part of a BERT encoder, its pooler, "
                              f"or a head qkv supports ({_SUPPORTED}); refused rather than dropped silently")


def state_dict_from_hf(tensors: dict[str, Tensor], config: ModelConfig, *, masked_lm: bool,
                       task: TaskConfig | None = None, source: str = "weights") -> dict[str, Tensor]:
    """qkv state dict (of :class:`MaskedLM` if ``masked_lm``, of the task model for ``task``, else
    of :class:`Encoder`) from HF tensors; the pooler's when ``config.pooler``.

    Raises:
        CheckpointError: a missing, mis-shaped, unexpected or unknown tensor, or an untied decoder.
    """
    tensors = {_rename_legacy(k): v for k, v in tensors.items()}
    prefix = _prefix(tensors)
    _check(tensors, config, masked_lm, task, prefix, source)
    enc = "encoder." if masked_lm or task is not None else ""
    out = {enc + ours: tensors[prefix + hf] for hf, ours, _ in _EMBEDDINGS}
    for i in range(config.n_layers):
        hf_layer, layer = f"{prefix}encoder.layer.{i}.", f"{enc}layers.{i}."
        for hf, ours, _ in _LAYER:
            out[layer + ours] = tensors[hf_layer + hf]
        for p in ("weight", "bias"):
            q, k, v = (tensors[f"{hf_layer}attention.self.{n}.{p}"] for n in ("query", "key", "value"))
            out[f"{layer}attention.qkv_proj.{p}"] = torch.cat([q, k, v], dim=0)  # 3 × (C,…) -> (3C,…)
    if config.pooler:
        out.update({enc + ours: tensors[prefix + hf] for hf, ours, _ in _POOLER})
    if task is not None:
        out.update({ours: tensors[hf] for hf, ours, _ in _CLASSIFIER})
    if masked_lm:
        out.update({ours: tensors[hf] for hf, ours, _ in _MLM})
        word = tensors[prefix + "embeddings.word_embeddings.weight"]
        decoder = tensors.get(_HEAD + "decoder.weight")
        if decoder is not None and not torch.equal(decoder, word):
            raise CheckpointError(f"{source}: {_HEAD}decoder.weight differs from the word embeddings; "
                                  "qkv ties them (untied decoders are not supported)")
    return out


def state_dict_to_hf(state: dict[str, Tensor], config: ModelConfig, *, masked_lm: bool,
                     task: TaskConfig | None = None) -> dict[str, Tensor]:
    """Hugging Face tensors (names of ``BertForMaskedLM`` if ``masked_lm``, of
    ``BertForSequenceClassification`` / ``BertForTokenClassification`` with ``task``, else of
    ``BertModel``; the pooler's when ``config.pooler``) from a qkv state dict. Each output tensor
    is contiguous and owns its memory (safetensors needs it)."""
    config_to_hf(config, masked_lm=masked_lm, task=task)  # raises if not expressible
    prefix, enc = ("bert.", "encoder.") if masked_lm or task is not None else ("", "")
    out = {prefix + hf: state[enc + ours] for hf, ours, _ in _EMBEDDINGS}
    for i in range(config.n_layers):
        hf_layer, layer = f"{prefix}encoder.layer.{i}.", f"{enc}layers.{i}."
        for hf, ours, _ in _LAYER:
            out[hf_layer + hf] = state[layer + ours]
        for p in ("weight", "bias"):
            parts = state[f"{layer}attention.qkv_proj.{p}"].chunk(3, dim=0)  # (3C,…) -> 3 × (C,…)
            for n, t in zip(("query", "key", "value"), parts):
                out[f"{hf_layer}attention.self.{n}.{p}"] = t
    if config.pooler:
        out.update({prefix + hf: state[enc + ours] for hf, ours, _ in _POOLER})
    if task is not None:
        out.update({hf: state[ours] for hf, ours, _ in _CLASSIFIER})
    if masked_lm:
        out.update({hf: state[ours] for hf, ours, _ in _MLM})
    return {k: v.detach().contiguous().clone() for k, v in out.items()}
