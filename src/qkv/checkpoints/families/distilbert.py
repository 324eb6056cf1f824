"""Hugging Face DistilBERT ⇄ qkv (``model_type: distilbert``).

Legend: C ``dim``, F ``hidden_dim``, V vocabulary, P position table size, L labels.

DistilBERT is a post-LN BERT encoder without segment embeddings (``type_vocab_size=0``) or
pooler, its LayerNorm epsilon fixed at 1e-12, with its own names under ``distilbert.``:
``transformer.layer.N.attention.{q_lin, k_lin, v_lin}`` (fused into qkv's ``qkv_proj``),
``attention.out_lin`` → ``attention.out_proj``, ``sa_layer_norm`` → ``norm1``, ``ffn.lin1`` /
``ffn.lin2`` → ``feed_forward.linear1`` / ``linear2``, ``output_layer_norm`` → ``norm2``; the
masked-LM head ``vocab_transform`` → ``head.dense``, ``vocab_layer_norm`` → ``head.norm``,
``vocab_projector`` (weight tied to the word embeddings) → ``head.bias``.

Positions: ``sinusoidal_pos_embds: true`` fills the position table with sinusoids at
initialisation; transformers stores it in the weights like a learned table. qkv reads either as
its learned table (the values are the checkpoint's) and exports ``sinusoidal_pos_embds: false``
with the same table, which gives the same outputs.

Read and written: ``DistilBertModel``, ``DistilBertForMaskedLM``,
``DistilBertForSequenceClassification`` (its head ``pre_classifier`` + ReLU + ``classifier`` on the
first token: qkv's task head with ``pooling="cls"``, ``head="relu"``; dropout
``seq_classif_dropout``), ``DistilBertForTokenClassification``. Refused, naming the architecture:
question answering, multiple choice.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from qkv.config import ModelConfig
from qkv.errors import CheckpointError
from qkv.checkpoints.families._common import (ACT_TO_HF, Imported, Plan, activation_from_hf, check_plan,
                                              check_tied, head_bias_reasons, head_reasons, kind_from_hf,
                                              refuse_causal_lm, refuse_unexpressible, sequence_task,
                                              state_from_plan, task_fields, tensors_from_plan, token_task)
from qkv.models.heads import TaskConfig

MODEL_TYPE = "distilbert"
NAME = "DistilBERT"
ARCHITECTURES = {"encoder": "DistilBertModel", "masked_lm": "DistilBertForMaskedLM",
                 "sequence_classification": "DistilBertForSequenceClassification",
                 "token_classification": "DistilBertForTokenClassification"}
_REFUSED = {"DistilBertForQuestionAnswering": "a question-answering head (qa_outputs.*)",
            "DistilBertForMultipleChoice": "a multiple-choice head"}
SUPPORTED = ("DistilBertModel, DistilBertForMaskedLM, DistilBertForSequenceClassification and "
             "DistilBertForTokenClassification")
#: DistilBERT's sequence-classification head in qkv's terms (TaskConfig fields); its token head is
#: the classifier alone.
SEQUENCE_HEAD = {"pooling": "cls", "head": "relu", "head_norm": False}
TOKEN_HEAD = {"head": None, "head_norm": False}
_EPS = 1e-12
_FIELDS = {"C": "dim", "F": "hidden_dim", "V": "vocab_size", "P": "max_position_embeddings",
           "L": "num_labels"}
_EMBEDDINGS = [
    ("embeddings.word_embeddings.weight", "embeddings.tokens.weight", "VC"),
    ("embeddings.position_embeddings.weight", "embeddings.positions.weight", "PC"),
    ("embeddings.LayerNorm.weight", "embeddings.norm.weight", "C"),
    ("embeddings.LayerNorm.bias", "embeddings.norm.bias", "C"),
]
_LAYER = [
    ("attention.out_lin.weight", "attention.out_proj.weight", "CC"),
    ("attention.out_lin.bias", "attention.out_proj.bias", "C"),
    ("sa_layer_norm.weight", "norm1.weight", "C"), ("sa_layer_norm.bias", "norm1.bias", "C"),
    ("ffn.lin1.weight", "feed_forward.linear1.weight", "FC"),
    ("ffn.lin1.bias", "feed_forward.linear1.bias", "F"),
    ("ffn.lin2.weight", "feed_forward.linear2.weight", "CF"),
    ("ffn.lin2.bias", "feed_forward.linear2.bias", "C"),
    ("output_layer_norm.weight", "norm2.weight", "C"), ("output_layer_norm.bias", "norm2.bias", "C"),
]
_MLM = [("vocab_transform.weight", "head.dense.weight", "CC"),
        ("vocab_transform.bias", "head.dense.bias", "C"),
        ("vocab_layer_norm.weight", "head.norm.weight", "C"),
        ("vocab_layer_norm.bias", "head.norm.bias", "C"),
        ("vocab_projector.bias", "head.bias", "V")]
_CLASSIFIER = [("classifier.weight", "classifier.weight", "LC"), ("classifier.bias", "classifier.bias", "L")]
_PRE_CLASSIFIER = [("pre_classifier.weight", "head.dense.weight", "CC"), ("pre_classifier.bias", "head.dense.bias", "C")]


def _plan(config: ModelConfig, kind: str, task: TaskConfig | None, prefix: str) -> Plan:
    enc = "" if kind == "encoder" else "encoder."
    dims = {"C": config.d_model, "F": config.ffn.d_ff, "V": config.vocab_size, "P": config.max_len,
            "L": task.num_labels if task is not None else 0}
    plan = Plan(dims, _FIELDS)
    plan.rows += [(prefix + hf, enc + ours, sym) for hf, ours, sym in _EMBEDDINGS]
    for i in range(config.n_layers):
        hf_layer, layer = f"{prefix}transformer.layer.{i}.", f"{enc}layers.{i}."
        plan.rows += [(hf_layer + hf, layer + ours, sym) for hf, ours, sym in _LAYER]
        for p, sym in (("weight", "CC"), ("bias", "C")):
            parts = tuple(f"{hf_layer}attention.{n}_lin.{p}" for n in ("q", "k", "v"))
            plan.fused.append((f"{layer}attention.qkv_proj.{p}", parts, sym))
    if kind == "masked_lm":
        plan.rows += _MLM
    if task is not None:
        plan.rows += (_PRE_CLASSIFIER if task.is_sequence else []) + _CLASSIFIER
    return plan


def _config(hf: dict[str, Any], source: str) -> ModelConfig:
    missing = [k for k in ("vocab_size", "dim", "n_layers", "n_heads", "hidden_dim") if k not in hf]
    if missing:
        raise CheckpointError(f"{source}: missing field(s) {missing}")
    try:
        return ModelConfig.from_flat(
            vocab_size=hf["vocab_size"], d_model=hf["dim"], n_heads=hf["n_heads"], d_ff=hf["hidden_dim"],
            n_layers=hf["n_layers"], max_len=hf.get("max_position_embeddings", 512), type_vocab_size=0,
            activation=activation_from_hf(hf.get("activation", "gelu"), source, "activation"), norm="post",
            dropout=float(hf.get("dropout", 0.1)), attention_dropout=float(hf.get("attention_dropout", 0.1)),
            position="learned", layer_norm_eps=_EPS, pad_token_id=hf.get("pad_token_id") or 0,
            initializer_range=float(hf.get("initializer_range", 0.02)), family=MODEL_TYPE)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def read(hf: dict[str, Any], tensors: dict[str, Tensor], *, config_source: str,
         weights_source: str) -> Imported:
    """A Hugging Face DistilBERT checkpoint as qkv's config, kind, task and state dict."""
    kind = kind_from_hf(hf, tensors, config_source, architectures_=ARCHITECTURES, refused=_REFUSED,
                        supported=SUPPORTED, head_prefixes={"masked_lm": ("vocab_transform.",)},
                        classifier=("classifier.", "pre_classifier."))
    task = (token_task(hf, config_source, hf.get("dropout", 0.1)) if kind == "token_classification" else
            sequence_task(hf, config_source, dropout=hf.get("seq_classif_dropout", 0.2), **SEQUENCE_HEAD)
            if kind == "sequence_classification" else None)
    config = _config(hf, config_source)
    prefix = "distilbert." if any(n.startswith("distilbert.") for n in tensors) else ""
    plan = _plan(config, kind, task, prefix)
    check_plan(tensors, plan, weights_source,
               ignored=(prefix + "embeddings.position_ids", "vocab_projector.weight"),
               owned=(prefix + "embeddings.", prefix + "transformer.", "vocab_", "classifier.", "pre_classifier."),
               layers_field="n_layers", n_layers=config.n_layers,
               unknown=f"a DistilBERT encoder or a head qkv supports ({SUPPORTED})")
    if kind == "masked_lm":
        check_tied(tensors, "vocab_projector.weight", prefix + "embeddings.word_embeddings.weight",
                   weights_source, what="the word embeddings")
    return Imported(config, kind, task, state_from_plan(tensors, plan))


def config_to_hf(config: ModelConfig, kind: str, task: TaskConfig | None = None) -> dict[str, Any]:
    """The Hugging Face DistilBERT ``config.json`` of a qkv model of ``kind``; raises
    :class:`CheckpointError` naming every option DistilBERT cannot express."""
    refuse_causal_lm(kind, NAME)
    extra = head_reasons(task, NAME, sequence=SEQUENCE_HEAD, token=TOKEN_HEAD)
    extra += head_bias_reasons(config, kind, NAME)
    if kind not in ARCHITECTURES:
        extra.append(f"kind {kind!r} (qkv writes DistilBERT as {', '.join(ARCHITECTURES.values())})")
    refuse_unexpressible(config, NAME, {
        "type_vocab_size": 0, "pooler": False, "position_offset": 0, "layer_norm_eps": _EPS,
        "embedding_size": (lambda c: c.embedding_size in (None, c.d_model), f"{config.d_model} = dim")},
        extra)
    out = {"architectures": [ARCHITECTURES[kind]], "model_type": MODEL_TYPE, "vocab_size": config.vocab_size,
           "dim": config.d_model, "n_layers": config.n_layers, "n_heads": config.attention.n_heads,
           "hidden_dim": config.ffn.d_ff, "activation": ACT_TO_HF[config.ffn.activation], "dropout": config.dropout,
           "attention_dropout": config.attention.dropout, "max_position_embeddings": config.max_len,
           "initializer_range": config.initializer_range, "pad_token_id": config.pad_token_id,
           "sinusoidal_pos_embds": False, "tie_word_embeddings": True}
    if task is not None:
        out.update(task_fields(task))
        if task.is_sequence:
            out["seq_classif_dropout"] = task.classifier_dropout
    return out


def write(state: dict[str, Tensor], config: ModelConfig, kind: str,
          task: TaskConfig | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json dict, tensors)`` of the Hugging Face DistilBERT checkpoint of a qkv model."""
    hf = config_to_hf(config, kind, task)
    return hf, tensors_from_plan(state, _plan(config, kind, task, "" if kind == "encoder" else "distilbert."))
