"""Hugging Face RoBERTa ⇄ qkv (``model_type: roberta``).

RoBERTa is BERT's layout under ``roberta.`` (see :mod:`qkv.checkpoints.families.bert`) with two
differences:

* **Positions start at pad id + 1**: a real token at index t uses position row
  ``pad_token_id + 1 + t`` (``create_position_ids_from_input_ids``). qkv reads this as
  ``position_offset = pad_token_id + 1`` and ``max_len = max_position_embeddings − offset``;
  the whole table (its first rows too) is kept, so it exports unchanged.
* **Its masked-LM head** ``lm_head.{dense, layer_norm, bias}`` (decoder tied to the word
  embeddings) maps to qkv's :class:`~qkv.models.mlm.MaskedLMHead`; it always applies GELU, so a
  masked-LM checkpoint with another ``hidden_act`` is refused.

* **Its sequence-classification head** ``classifier.dense`` + tanh + ``classifier.out_proj`` on the
  first token (``<s>``) is qkv's task head with ``pooling="cls"``, ``head="tanh"``
  (:class:`~qkv.models.heads.TaskHead`). A classifier fine-tuned on BERT's pooler
  (``pooling="pooler"``: the same tanh(dense(h[:, 0]))) is written with the pooler as
  ``classifier.dense``.

Read and written: ``RobertaModel`` (with or without its pooler), ``RobertaForMaskedLM``,
``RobertaForSequenceClassification`` (classification and regression),
``RobertaForTokenClassification``. Refused, naming the architecture: question answering, multiple
choice, causal LM.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from qkv.config import ModelConfig
from qkv.errors import CheckpointError
from qkv.checkpoints.families import bert
from qkv.checkpoints.families._common import (Imported, check_plan, check_tied, head_bias_reasons, head_reasons,
                                              kind_from_hf, refuse_causal_lm, refuse_unexpressible, sequence_task,
                                              state_from_plan, task_fields, tensors_from_plan, token_task)
from qkv.models.heads import TaskConfig

MODEL_TYPE = "roberta"
NAME = "RoBERTa"
ARCHITECTURES = {"encoder": "RobertaModel", "masked_lm": "RobertaForMaskedLM",
                 "sequence_classification": "RobertaForSequenceClassification",
                 "token_classification": "RobertaForTokenClassification"}
_REFUSED = {"RobertaForQuestionAnswering": "a question-answering head (qa_outputs.*)",
            "RobertaForMultipleChoice": "a multiple-choice head",
            "RobertaForCausalLM": "a causal language model (decoder)"}
SUPPORTED = ("RobertaModel, RobertaForMaskedLM, RobertaForSequenceClassification and "
             "RobertaForTokenClassification")
#: The shape of RoBERTa's sequence-classification head in qkv's terms (TaskConfig fields).
SEQUENCE_HEAD = {"pooling": "cls", "head": "tanh", "head_norm": False}
#: Its token-classification head: the classifier alone.
TOKEN_HEAD = {"head": None, "head_norm": False}
_SEQUENCE = [("classifier.dense.weight", "head.dense.weight", "CC"), ("classifier.dense.bias", "head.dense.bias", "C"),
             ("classifier.out_proj.weight", "classifier.weight", "LC"),
             ("classifier.out_proj.bias", "classifier.bias", "L")]
_HEAD = "lm_head."
_MLM = [(_HEAD + "dense.weight", "head.dense.weight", "CC"), (_HEAD + "dense.bias", "head.dense.bias", "C"),
        (_HEAD + "layer_norm.weight", "head.norm.weight", "C"),
        (_HEAD + "layer_norm.bias", "head.norm.bias", "C"), (_HEAD + "bias", "head.bias", "V")]


def _plan(config: ModelConfig, kind: str, task: TaskConfig | None, prefix: str):
    enc = "" if kind == "encoder" else "encoder."
    plan = bert.encoder_plan(config, prefix, enc, n_labels=task.num_labels if task is not None else 0)
    if kind == "masked_lm":
        plan.rows += _MLM
    if task is not None:
        plan.rows += _SEQUENCE if task.is_sequence else bert.CLASSIFIER
    return plan


def _pooler_as_head(config: ModelConfig, task: TaskConfig | None, state: dict[str, Tensor] | None = None):
    """A sequence head on BERT's pooler (tanh(dense(h[:, 0]))) as RoBERTa's ``classifier.dense`` + tanh:
    ``(config without the pooler, task with pooling "cls" and head "tanh", state renamed)``."""
    if task is None or not task.is_sequence or task.pooling != "pooler" or task.head is not None:
        return config, task, state
    if state is not None:
        state = {("head." + k[len("encoder.pooler."):] if k.startswith("encoder.pooler.") else k): v
                 for k, v in state.items()}
    return config.replace(pooler=False), dataclasses.replace(task, pooling="cls", head="tanh"), state


def read(hf: dict[str, Any], tensors: dict[str, Tensor], *, config_source: str,
         weights_source: str) -> Imported:
    """A Hugging Face RoBERTa checkpoint as qkv's config, kind, task and state dict."""
    kind = kind_from_hf(hf, tensors, config_source, architectures_=ARCHITECTURES, refused=_REFUSED,
                        supported=SUPPORTED, head_prefixes={"masked_lm": (_HEAD,)})
    task = (token_task(hf, config_source) if kind == "token_classification" else
            sequence_task(hf, config_source, **SEQUENCE_HEAD) if kind == "sequence_classification" else None)
    pad = hf.get("pad_token_id")
    pad = 1 if pad is None else pad
    size = hf.get("max_position_embeddings", 514)
    if size <= pad + 1:
        raise CheckpointError(f"{config_source}: max_position_embeddings={size} leaves no position after the "
                              f"offset pad_token_id + 1 = {pad + 1}")
    if kind == "masked_lm" and hf.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"{config_source}: hidden_act={hf['hidden_act']!r} with RobertaForMaskedLM is "
                              "not supported: its head applies gelu, qkv's the encoder's activation")
    prefix = "roberta." if any(n.startswith("roberta.") for n in tensors) else ""
    config = bert.bert_like_config({**hf, "pad_token_id": pad}, config_source, family=MODEL_TYPE,
                                   pooler=bert.has_pooler(tensors, "roberta."), max_len=size - pad - 1,
                                   position_offset=pad + 1)
    plan = _plan(config, kind, task, prefix)
    check_plan(tensors, plan, weights_source,
               ignored=tuple(prefix + n for n in bert.IGNORED_ENCODER) + (_HEAD + "decoder.",),
               owned=(prefix + "embeddings.", prefix + "encoder.", prefix + "pooler.", _HEAD, "classifier."),
               layers_field="num_hidden_layers", n_layers=config.n_layers, pooler=prefix + "pooler.",
               unknown=f"a RoBERTa encoder, its pooler, or a head qkv supports ({SUPPORTED})")
    if kind == "masked_lm":
        check_tied(tensors, _HEAD + "decoder.weight", prefix + "embeddings.word_embeddings.weight",
                   weights_source, what="the word embeddings")
        check_tied(tensors, _HEAD + "decoder.bias", _HEAD + "bias", weights_source)
    return Imported(config, kind, task, state_from_plan(tensors, plan))


def config_to_hf(config: ModelConfig, kind: str, task: TaskConfig | None = None) -> dict[str, Any]:
    """The Hugging Face RoBERTa ``config.json`` of a qkv model of ``kind``; raises
    :class:`CheckpointError` naming every option RoBERTa cannot express."""
    refuse_causal_lm(kind, NAME)
    config, task, _ = _pooler_as_head(config, task)
    extra = head_reasons(task, NAME, sequence=SEQUENCE_HEAD, token=TOKEN_HEAD)
    if config.type_vocab_size < 1:
        extra.append("type_vocab_size=0 (RoBERTa needs ≥ 1)")
    extra += head_bias_reasons(config, kind, NAME)
    if kind not in ARCHITECTURES:
        extra.append(f"kind {kind!r} (qkv writes RoBERTa as {', '.join(ARCHITECTURES.values())})")
    if kind == "masked_lm" and config.ffn.activation != "gelu":
        extra.append(f"activation={config.ffn.activation!r} with a masked-LM head (RoBERTa's head applies gelu)")
    refuse_unexpressible(config, NAME, {
        "embedding_size": (lambda c: c.embedding_size in (None, c.d_model),
                           f"{config.d_model} = hidden_size"),
        "position_offset": (lambda c: c.positions.offset == c.pad_token_id + 1,
                            f"pad_token_id + 1 = {config.pad_token_id + 1}")}, extra)
    out = bert.bert_like_hf_config(config, MODEL_TYPE, ARCHITECTURES[kind])
    if task is not None:
        out.update(task_fields(task), classifier_dropout=task.classifier_dropout)
    return out


def write(state: dict[str, Tensor], config: ModelConfig, kind: str,
          task: TaskConfig | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json dict, tensors)`` of the Hugging Face RoBERTa checkpoint of a qkv model."""
    hf = config_to_hf(config, kind, task)
    config, task, state = _pooler_as_head(config, task, state)
    return hf, tensors_from_plan(state, _plan(config, kind, task, "" if kind == "encoder" else "roberta."))
