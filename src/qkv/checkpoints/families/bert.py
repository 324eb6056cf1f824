"""Hugging Face BERT ⇄ qkv (``model_type: bert``).

Legend: C hidden size, F intermediate size, V vocabulary, P position table size, S segment ids,
L labels.

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

The layout helpers (:func:`encoder_plan`, :func:`bert_like_config`) serve the families that
share BERT's layer names (RoBERTa, ELECTRA).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from qkv.config import ModelConfig
from qkv.errors import CheckpointError
from qkv.checkpoints.families._common import (ACT_TO_HF, Imported, Plan, activation_from_hf, architectures,
                                              check_plan, check_tied, head_bias_reasons, kind_of, refuse_causal_lm,
                                              refuse_unexpressible, sequence_task, state_from_plan, task_fields,
                                              tensors_from_plan, token_task)
from qkv.models.heads import TaskConfig

MODEL_TYPE = "bert"
NAME = "BERT"
#: BERT's classification heads in qkv's terms (TaskConfig fields): the pooler, then the classifier.
SEQUENCE_HEAD = {"pooling": "pooler", "head": None, "head_norm": False}
TOKEN_HEAD = {"head": None, "head_norm": False}
ARCHITECTURES = {"masked_lm": "BertForMaskedLM", "encoder": "BertModel",
                 "sequence_classification": "BertForSequenceClassification",
                 "token_classification": "BertForTokenClassification"}

FIELDS = {"C": "hidden_size", "E": "embedding_size", "F": "intermediate_size", "V": "vocab_size",
          "P": "max_position_embeddings", "S": "type_vocab_size", "L": "num_labels"}
_HEAD = "cls.predictions."
#: (Hugging Face name relative to the encoder, qkv name relative to the encoder, symbolic shape)
EMBEDDINGS = [
    ("embeddings.word_embeddings.weight", "embeddings.tokens.weight", "VE"),
    ("embeddings.position_embeddings.weight", "embeddings.positions.weight", "PE"),
    ("embeddings.token_type_embeddings.weight", "embeddings.segments.weight", "SE"),
    ("embeddings.LayerNorm.weight", "embeddings.norm.weight", "E"),
    ("embeddings.LayerNorm.bias", "embeddings.norm.bias", "E"),
]
LAYER = [  # the query/key/value maps are handled apart (fused)
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
_MLM = [
    (_HEAD + "transform.dense.weight", "head.dense.weight", "CC"),
    (_HEAD + "transform.dense.bias", "head.dense.bias", "C"),
    (_HEAD + "transform.LayerNorm.weight", "head.norm.weight", "C"),
    (_HEAD + "transform.LayerNorm.bias", "head.norm.bias", "C"),
    (_HEAD + "bias", "head.bias", "V"),
]
POOLER = [("pooler.dense.weight", "pooler.dense.weight", "CC"),
          ("pooler.dense.bias", "pooler.dense.bias", "C")]
CLASSIFIER = [("classifier.weight", "classifier.weight", "LC"), ("classifier.bias", "classifier.bias", "L")]
IGNORED_ENCODER = ("embeddings.position_ids", "embeddings.token_type_ids")
_NSP = "cls.seq_relationship."  # BertForPreTraining's next-sentence head: tolerated, ignored
_SEQUENCE, _TOKEN = "BertForSequenceClassification", "BertForTokenClassification"
_REFUSED = {"BertForQuestionAnswering": "a question-answering head (qa_outputs.*)",
            "BertForMultipleChoice": "a multiple-choice head"}
SUPPORTED = ("BertModel, BertForMaskedLM, BertForPreTraining (its next-sentence head ignored), "
             "BertForSequenceClassification (single-label or regression) and BertForTokenClassification")


def bert_like_config(hf: dict[str, Any], source: str, *, family: str, pooler: bool,
                     max_len: int | None = None, position_offset: int = 0,
                     embedding_size: int | None = None) -> ModelConfig:
    """A :class:`ModelConfig` from the ``config.json`` of a family with BERT's fields."""
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                           "intermediate_size") if k not in hf]
    if missing:
        raise CheckpointError(f"{source}: missing field(s) {missing}")
    unsupported = {"is_decoder": False, "add_cross_attention": False, "position_embedding_type": "absolute"}
    for key, want in unsupported.items():
        if hf.get(key, want) != want:
            raise CheckpointError(f"{source}: {key}={hf[key]!r} is not supported; expected {want!r}")
    act = activation_from_hf(hf.get("hidden_act", "gelu"), source)
    try:
        return ModelConfig.from_flat(
            vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_heads=hf["num_attention_heads"],
            d_ff=hf["intermediate_size"], n_layers=hf["num_hidden_layers"],
            max_len=hf.get("max_position_embeddings", 512) if max_len is None else max_len,
            type_vocab_size=hf.get("type_vocab_size", 2),
            activation=act, norm="post", dropout=float(hf.get("hidden_dropout_prob", 0.1)),
            attention_dropout=float(hf.get("attention_probs_dropout_prob", 0.1)), position="learned",
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            pad_token_id=hf.get("pad_token_id") or 0,
            initializer_range=float(hf.get("initializer_range", 0.02)),
            pooler=pooler, position_offset=position_offset, embedding_size=embedding_size, family=family,
        )
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def bert_like_hf_config(config: ModelConfig, model_type: str, arch: str) -> dict[str, Any]:
    """The ``config.json`` fields BERT-layout families share."""
    return {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.attention.n_heads,
        "intermediate_size": config.ffn.d_ff,
        "hidden_act": ACT_TO_HF[config.ffn.activation],
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attention.dropout,
        "max_position_embeddings": config.max_len + config.positions.offset,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.norm.eps,
        "pad_token_id": config.pad_token_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }


def encoder_plan(config: ModelConfig, prefix: str, enc: str, *, n_labels: int = 0) -> Plan:
    """The embeddings and layers of a BERT-layout encoder: Hugging Face names under ``prefix``
    (``"bert."`` in a headed checkpoint), qkv names under ``enc`` (``"encoder."`` in a headed model)."""
    width = config.embedding_size or config.d_model
    dims = {"C": config.d_model, "E": width, "F": config.ffn.d_ff, "V": config.vocab_size,
            "P": config.max_len + config.positions.offset, "S": config.type_vocab_size, "L": n_labels}
    plan = Plan(dims, {**FIELDS, "E": "embedding_size" if config.embedding_size else "hidden_size"})
    plan.rows += [(prefix + hf, enc + ours, sym) for hf, ours, sym in EMBEDDINGS]
    for i in range(config.n_layers):
        hf_layer, layer = f"{prefix}encoder.layer.{i}.", f"{enc}layers.{i}."
        plan.rows += [(hf_layer + hf, layer + ours, sym) for hf, ours, sym in LAYER]
        for p, sym in (("weight", "CC"), ("bias", "C")):
            parts = tuple(f"{hf_layer}attention.self.{n}.{p}" for n in ("query", "key", "value"))
            plan.fused.append((f"{layer}attention.qkv_proj.{p}", parts, sym))
    if config.pooler:
        plan.rows += [(prefix + hf, enc + ours, sym) for hf, ours, sym in POOLER]
    return plan


def _rename_legacy(name: str) -> str:
    """TF-converted checkpoints name LayerNorm parameters gamma/beta."""
    if "LayerNorm." in name:
        return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
    return name


def has_pooler(names, prefix: str = "bert.") -> bool:
    """Whether a set of Hugging Face tensor names includes the pooler (with or without ``prefix``)."""
    return any(n.startswith(("pooler.dense.", prefix + "pooler.dense.")) for n in names)


def head_from_hf(hf: dict[str, Any], names, *, source: str = "config.json") -> tuple[bool, TaskConfig | None]:
    """The head of a Hugging Face BERT checkpoint: ``(masked_lm, task)`` from its ``config.json``
    dict and tensor names; ``(False, None)`` for a bare encoder.

    Raises:
        CheckpointError: a head qkv does not support (named), or tensors and architectures that
            disagree; qkv never drops a head silently.
    """
    names = set(names)
    archs = architectures(hf)
    refused = [a for a in archs if a in _REFUSED]
    if refused or any(n.startswith("qa_outputs.") for n in names):
        what = f"{refused[0]}: {_REFUSED[refused[0]]}" if refused else _REFUSED["BertForQuestionAnswering"]
        raise CheckpointError(f"{source}: {what} is not supported; qkv loads {SUPPORTED}, and never drops "
                              "a head silently")
    heads = [a for a in archs if a in (_SEQUENCE, _TOKEN)]
    masked_lm = any(n.startswith(_HEAD + "transform.") for n in names)
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
    if archs[0] == _TOKEN:
        return False, token_task(hf, source)
    return False, sequence_task(hf, source)


def _plan(config: ModelConfig, kind: str, task: TaskConfig | None, prefix: str) -> Plan:
    enc = "" if kind == "encoder" else "encoder."
    plan = encoder_plan(config, prefix, enc, n_labels=task.num_labels if task is not None else 0)
    if kind == "masked_lm":
        plan.rows += _MLM
    if task is not None:
        plan.rows += CLASSIFIER
    return plan


def read(hf: dict[str, Any], tensors: dict[str, Tensor], *, config_source: str,
         weights_source: str) -> Imported:
    """A Hugging Face BERT checkpoint (``config.json`` dict and tensors) as qkv's config, kind,
    task and state dict.

    Raises:
        CheckpointError: a missing, mis-shaped, unexpected or unknown tensor, an untied decoder, a
            head or config option qkv does not support.
    """
    tensors = {_rename_legacy(k): v for k, v in tensors.items()}
    masked_lm, task = head_from_hf(hf, tensors, source=config_source)
    pooler = has_pooler(tensors) or (task is not None and task.is_sequence)  # else: a missing tensor
    config = bert_like_config(hf, config_source, family=MODEL_TYPE, pooler=pooler)
    kind = kind_of(masked_lm, task)
    prefix = "bert." if any(n.startswith("bert.") for n in tensors) else ""
    plan = _plan(config, kind, task, prefix)
    check_plan(tensors, plan, weights_source,
               ignored=tuple(prefix + n for n in IGNORED_ENCODER) + (_HEAD + "decoder.", _NSP),
               owned=(prefix + "embeddings.", prefix + "encoder.", prefix + "pooler.", _HEAD, "classifier."),
               layers_field="num_hidden_layers", n_layers=config.n_layers, pooler=prefix + "pooler.",
               unknown=f"a BERT encoder, its pooler, or a head qkv supports ({SUPPORTED})")
    if masked_lm:
        check_tied(tensors, _HEAD + "decoder.weight", prefix + "embeddings.word_embeddings.weight",
                   weights_source, what="the word embeddings")
    return Imported(config, kind, task, state_from_plan(tensors, plan))


def config_to_hf(config: ModelConfig, kind: str, task: TaskConfig | None = None) -> dict[str, Any]:
    """The Hugging Face BERT ``config.json`` of a qkv model of ``kind``; raises
    :class:`CheckpointError` naming every option BERT cannot express."""
    refuse_causal_lm(kind, NAME)
    extra = []
    if config.type_vocab_size < 1:
        extra.append("type_vocab_size=0 (BERT needs ≥ 1)")
    if task is not None and task.is_sequence and task.pooling != "pooler":
        extra.append(f"pooling={task.pooling!r} ({_SEQUENCE} classifies the BERT pooler's output: "
                     "needs 'pooler')")
    if task is not None and task.head is not None:
        extra.append(f"the task head's head={task.head!r} (BERT's classifiers have no map before the classifier "
                     "but the pooler; keep it in the qkv format, or export with the family it came from)")
    extra += head_bias_reasons(config, kind, NAME)
    if kind not in ARCHITECTURES:
        extra.append(f"kind {kind!r} (BERT has no such head; it has {', '.join(ARCHITECTURES)})")
    refuse_unexpressible(config, NAME, {"embedding_size": (lambda c: c.embedding_size in (None, c.d_model),
                                                           f"{config.d_model} = hidden_size"),
                                        "position_offset": 0}, extra)
    out = bert_like_hf_config(config, MODEL_TYPE, ARCHITECTURES[kind])
    if task is not None:
        out.update(task_fields(task), classifier_dropout=task.classifier_dropout)
    return out


def write(state: dict[str, Tensor], config: ModelConfig, kind: str,
          task: TaskConfig | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json dict, tensors)`` of the Hugging Face BERT checkpoint of a qkv model."""
    hf = config_to_hf(config, kind, task)
    return hf, tensors_from_plan(state, _plan(config, kind, task, "" if kind == "encoder" else "bert."))
