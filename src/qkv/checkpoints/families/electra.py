"""Hugging Face ELECTRA (discriminator) ⇄ qkv (``model_type: electra``).

ELECTRA is BERT's layout under ``electra.`` (see :mod:`qkv.checkpoints.families.bert`) whose embeddings
may be narrower than the layers: with ``embedding_size`` E ≠ ``hidden_size`` C the token,
position and segment tables and the embedding LayerNorm are E wide, and ``embeddings_project``
``Linear(E, C)`` follows the embeddings (after their LayerNorm and dropout, as ``ElectraModel``
does). qkv reads this as ``ModelConfig.embedding_size = E`` (the encoder's ``embed_proj``);
E = C gives ``embedding_size=None`` and no projection, as in transformers.

Read: ``ElectraModel``, ``ElectraForPreTraining`` (the discriminator head
``discriminator_predictions.dense`` C → C, activation ``hidden_act``, ``dense_prediction`` C → 1:
a qkv :class:`~qkv.models.discriminator.Discriminator`, kind ``"discriminator"``),
``ElectraForSequenceClassification`` (its head ``classifier.dense`` + GELU + ``classifier.out_proj``
on the first token: qkv's task head with ``pooling="cls"``, ``head="gelu"``) and
``ElectraForTokenClassification``; each is written back the same way. Refused, naming the
architecture: ``ElectraForMaskedLM`` (the generator), question answering, multiple choice, causal LM.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from qkv.config import ModelConfig
from qkv.checkpoints.families import bert
from qkv.checkpoints.families._common import (Imported, check_plan, head_reasons, kind_from_hf, refuse_causal_lm,
                                              refuse_unexpressible, sequence_task, state_from_plan, task_fields,
                                              tensors_from_plan, token_task)
from qkv.models.heads import TaskConfig

MODEL_TYPE = "electra"
NAME = "ELECTRA"
ARCHITECTURES = {"encoder": "ElectraModel", "discriminator": "ElectraForPreTraining",
                 "sequence_classification": "ElectraForSequenceClassification",
                 "token_classification": "ElectraForTokenClassification"}
_REFUSED = {"ElectraForMaskedLM": "the generator (a masked-LM head on E-wide embeddings)",
            "ElectraForQuestionAnswering": "a question-answering head (qa_outputs.*)",
            "ElectraForMultipleChoice": "a multiple-choice head",
            "ElectraForCausalLM": "a causal language model (decoder)"}
SUPPORTED = ("ElectraModel, ElectraForPreTraining (the discriminator), ElectraForSequenceClassification and "
             "ElectraForTokenClassification")
#: ELECTRA's sequence-classification head in qkv's terms (TaskConfig fields); its token head is the
#: classifier alone.
SEQUENCE_HEAD = {"pooling": "cls", "head": "gelu", "head_norm": False}
TOKEN_HEAD = {"head": None, "head_norm": False}
_SEQUENCE = [("classifier.dense.weight", "head.dense.weight", "CC"), ("classifier.dense.bias", "head.dense.bias", "C"),
             ("classifier.out_proj.weight", "classifier.weight", "LC"),
             ("classifier.out_proj.bias", "classifier.bias", "L")]
_HEAD = "discriminator_predictions."
_DISCRIMINATOR = [(_HEAD + "dense.weight", "head.dense.weight", "CC"),
                  (_HEAD + "dense.bias", "head.dense.bias", "C"),
                  (_HEAD + "dense_prediction.weight", "head.prediction.weight", "OC"),
                  (_HEAD + "dense_prediction.bias", "head.prediction.bias", "O")]


def _plan(config: ModelConfig, kind: str, task: TaskConfig | None, prefix: str):
    enc = "" if kind == "encoder" else "encoder."
    plan = bert.encoder_plan(config, prefix, enc, n_labels=task.num_labels if task is not None else 0)
    plan.dims["O"] = 1
    plan.fields = {**plan.fields, "O": "one logit"}
    if config.embedding_size not in (None, config.d_model):
        plan.rows += [(prefix + "embeddings_project.weight", enc + "embed_proj.weight", "CE"),
                      (prefix + "embeddings_project.bias", enc + "embed_proj.bias", "C")]
    if kind == "discriminator":
        plan.rows += _DISCRIMINATOR
    if task is not None:
        plan.rows += _SEQUENCE if task.is_sequence else bert.CLASSIFIER
    return plan


def read(hf: dict[str, Any], tensors: dict[str, Tensor], *, config_source: str,
         weights_source: str) -> Imported:
    """A Hugging Face ELECTRA checkpoint as qkv's config, kind, task and state dict."""
    kind = kind_from_hf(hf, tensors, config_source, architectures_=ARCHITECTURES, refused=_REFUSED,
                        supported=SUPPORTED, head_prefixes={"discriminator": (_HEAD,)})
    task = (token_task(hf, config_source) if kind == "token_classification" else
            sequence_task(hf, config_source, **SEQUENCE_HEAD) if kind == "sequence_classification" else None)
    width = hf.get("embedding_size", 128)
    config = bert.bert_like_config(hf, config_source, family=MODEL_TYPE, pooler=False,
                                   embedding_size=None if width == hf.get("hidden_size") else width)
    prefix = "electra." if any(n.startswith("electra.") for n in tensors) else ""
    plan = _plan(config, kind, task, prefix)
    check_plan(tensors, plan, weights_source, ignored=tuple(prefix + n for n in bert.IGNORED_ENCODER),
               owned=(prefix + "embeddings.", prefix + "encoder.", prefix + "embeddings_project.", _HEAD,
                      "classifier."),
               layers_field="num_hidden_layers", n_layers=config.n_layers,
               unknown=f"an ELECTRA encoder or a head qkv supports ({SUPPORTED})")
    return Imported(config, kind, task, state_from_plan(tensors, plan))


def config_to_hf(config: ModelConfig, kind: str, task: TaskConfig | None = None) -> dict[str, Any]:
    """The Hugging Face ELECTRA ``config.json`` of a qkv model of ``kind``; raises
    :class:`CheckpointError` naming every option ELECTRA cannot express."""
    refuse_causal_lm(kind, NAME)
    extra = head_reasons(task, NAME, sequence=SEQUENCE_HEAD, token=TOKEN_HEAD)
    if config.type_vocab_size < 1:
        extra.append("type_vocab_size=0 (ELECTRA needs ≥ 1)")
    if kind not in ARCHITECTURES:
        extra.append(f"kind {kind!r} (qkv writes ELECTRA as {', '.join(ARCHITECTURES.values())})")
    refuse_unexpressible(config, NAME, {"pooler": False, "position_offset": 0}, extra)
    out = bert.bert_like_hf_config(config, MODEL_TYPE, ARCHITECTURES[kind])
    out["embedding_size"] = config.embedding_size or config.d_model
    if task is not None:
        out.update(task_fields(task), classifier_dropout=task.classifier_dropout)
    return out


def write(state: dict[str, Tensor], config: ModelConfig, kind: str,
          task: TaskConfig | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json dict, tensors)`` of the Hugging Face ELECTRA checkpoint of a qkv model."""
    hf = config_to_hf(config, kind, task)
    return hf, tensors_from_plan(state, _plan(config, kind, task, "" if kind == "encoder" else "electra."))
