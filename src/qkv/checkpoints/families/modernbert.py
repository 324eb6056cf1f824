"""Hugging Face ModernBERT ⇄ qkv (``model_type: modernbert``; Warner et al. 2024).

Legend: C hidden size, F intermediate size, V vocabulary.

ModernBERT is a pre-LN encoder built from parts qkv has, each a :class:`~qkv.config.ModelConfig`
field:

* token embeddings only (no positions, no segments: ``type_vocab_size=0``), then a norm;
* rotary positions (``position="rope"``) with one base on global layers (``rope_base``, the
  ``full_attention`` ``rope_theta``) and another on local ones (``local_rope_base``, the
  ``sliding_attention`` one);
* sliding-window attention (``local_window`` = ``local_attention``: keys within
  ``local_attention // 2`` positions either side) with a global layer every
  ``global_attn_every_n_layers`` layers (qkv's ``layer_types`` and Hugging Face's must follow that pattern);
* the fused ``Wqkv`` map (rows ``[q; k; v]``, as qkv's ``qkv_proj``) and ``Wo``;
* a gated feed-forward (GeGLU, ``feed_forward="glu"``): ``Wi`` C → 2F (first half through the
  activation, second half the gate), ``Wo`` F → C;
* no attention norm in layer 0 (``first_attention_norm=False``: the embeddings are normalised
  already), a final norm; biases switched by ``attention_bias``, ``mlp_bias``, ``norm_bias``;
* the masked-LM head ``head.{dense, norm}`` (its dense bias: ``classifier_bias`` → ``head_bias``)
  and ``decoder`` tied to the token embeddings (``decoder_bias=False`` reads as a zero bias).

Read and written: ``ModernBertModel``, ``ModernBertForMaskedLM``,
``ModernBertForSequenceClassification`` and ``ModernBertForTokenClassification`` (their prediction
head ``head.dense`` + ``classifier_activation`` + ``head.norm`` before ``classifier``, after
``classifier_pooling`` ``cls`` or ``mean`` for sequences: qkv's task head with ``head`` the
activation and ``head_norm=True``, :class:`~qkv.models.heads.TaskHead`). Refused, naming the
architecture: question answering, multiple choice. Also refused: a ``layer_types`` that is not
"global every k layers", a rotary type other than ``default``, a masked-LM head activation
other than the layers', ``mlp_dropout`` other than
``embedding_dropout`` (qkv has one dropout rate for the embeddings and the sublayer outputs).
Dropout only acts in training, and sits where qkv puts it (after the embeddings and on each
sublayer's output, ``dropout``; on the attention weights, ``attention_dropout``): ModernBERT's own
places differ slightly (its attention output drops with ``attention_dropout``, its MLP inside the
gate). Outputs in eval mode are the same.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from qkv.config import ModelConfig, layer_period
from qkv.errors import CheckpointError
from qkv.checkpoints.families._common import (ACT_TO_HF, Imported, Plan, activation_from_hf, check_plan,
                                              check_tied, head_reasons, kind_from_hf, refuse_causal_lm,
                                              refuse_unexpressible, sequence_task, state_from_plan, task_fields,
                                              tensors_from_plan, token_task)
from qkv.models.heads import TaskConfig

MODEL_TYPE = "modernbert"
NAME = "ModernBERT"
ARCHITECTURES = {"encoder": "ModernBertModel", "masked_lm": "ModernBertForMaskedLM",
                 "sequence_classification": "ModernBertForSequenceClassification",
                 "token_classification": "ModernBertForTokenClassification"}
_REFUSED = {"ModernBertForQuestionAnswering": "a question-answering head",
            "ModernBertForMultipleChoice": "a multiple-choice head"}
SUPPORTED = ("ModernBertModel, ModernBertForMaskedLM, ModernBertForSequenceClassification and "
             "ModernBertForTokenClassification")
#: ModernBERT's classification heads in qkv's terms (TaskConfig fields; a tuple: any of these).
SEQUENCE_HEAD = {"pooling": ("cls", "mean"), "head": tuple(ACT_TO_HF), "head_norm": True}
TOKEN_HEAD = {"head": tuple(ACT_TO_HF), "head_norm": True}
FIELDS = {"C": "hidden_size", "G": "2 × intermediate_size", "F": "intermediate_size", "V": "vocab_size",
          "Q": "3 × hidden_size", "L": "num_labels"}
_DEFAULT_THETA = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}
_OLD_THETA = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}


def _norm(hf_name: str, ours: str, config: ModelConfig) -> list[tuple[str, str, str]]:
    rows = [(hf_name + ".weight", ours + ".weight", "C")]
    return rows + ([(hf_name + ".bias", ours + ".bias", "C")] if config.norm.bias else [])


def _linear(hf_name: str, ours: str, sym: str, bias: bool) -> list[tuple[str, str, str]]:
    rows = [(hf_name + ".weight", ours + ".weight", sym)]
    return rows + ([(hf_name + ".bias", ours + ".bias", sym[0])] if bias else [])


def _plan(config: ModelConfig, kind: str, n_labels: int = 0) -> Plan:
    """The tensors of a ModernBERT checkpoint of ``kind`` (an encoder, a masked LM, a classifier of
    ``n_labels``)."""
    prefix, enc = ("", "") if kind == "encoder" else ("model.", "encoder.")
    plan = Plan({"C": config.d_model, "G": 2 * config.ffn.d_ff, "F": config.ffn.d_ff, "V": config.vocab_size,
                 "Q": 3 * config.d_model, "L": n_labels}, FIELDS)
    rows = [(prefix + "embeddings.tok_embeddings.weight", enc + "embeddings.tokens.weight", "VC")]
    rows += _norm(prefix + "embeddings.norm", enc + "embeddings.norm", config)
    for i in range(config.n_layers):
        hf, ours = f"{prefix}layers.{i}.", f"{enc}layers.{i}."
        if i > 0 or config.norm.first_attention:
            rows += _norm(hf + "attn_norm", ours + "norm1", config)
        rows += _linear(hf + "attn.Wqkv", ours + "attention.qkv_proj", "QC", config.attention.bias)
        rows += _linear(hf + "attn.Wo", ours + "attention.out_proj", "CC", config.attention.bias)
        rows += _norm(hf + "mlp_norm", ours + "norm2", config)
        rows += _linear(hf + "mlp.Wi", ours + "feed_forward.linear1", "GC", config.ffn.bias)
        rows += _linear(hf + "mlp.Wo", ours + "feed_forward.linear2", "CF", config.ffn.bias)
    rows += _norm(prefix + "final_norm", enc + "final_norm", config)
    if kind != "encoder":  # the masked-LM head, or the task head before the classifier
        rows += _linear("head.dense", "head.dense", "CC", config.head_bias)
        rows += _norm("head.norm", "head.norm", config)
    if kind in ("sequence_classification", "token_classification"):
        rows += _linear("classifier", "classifier", "LC", True)
    plan.rows = rows
    return plan


def _layer_pattern(hf: dict[str, Any], source: str) -> tuple[bool, int]:
    """``(any local layer, global_every)`` from ``layer_types`` (or ``global_attn_every_n_layers``)."""
    n = hf["num_hidden_layers"]
    every = hf.get("global_attn_every_n_layers", 3)
    types = hf.get("layer_types")
    if types is None:
        types = ["sliding_attention" if i % every else "full_attention" for i in range(n)]
    types = list(types)
    if len(types) != n or not set(types) <= {"full_attention", "sliding_attention"}:
        raise CheckpointError(f"{source}: layer_types={types!r} must list 'full_attention' or "
                              f"'sliding_attention' for each of the {n} layers")
    if "sliding_attention" not in types:
        return False, 1
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    every = full[1] if len(full) > 1 else n  # the second global layer, or only layer 0 global
    if not full or full[0] != 0 or any((i % every == 0) != (t == "full_attention") for i, t in enumerate(types)):
        raise CheckpointError(f"{source}: layer_types={types!r} is not 'a global layer every k layers, "
                              "starting with layer 0', the only pattern qkv builds")
    return True, every


def _rope_bases(hf: dict[str, Any], source: str) -> dict[str, float]:
    params = hf.get("rope_parameters") or {}
    bases = {}
    for layer_type, default in _DEFAULT_THETA.items():
        p = params.get(layer_type) or {}
        if p.get("rope_type", "default") != "default":
            raise CheckpointError(f"{source}: rope_parameters[{layer_type!r}] rope_type="
                                  f"{p['rope_type']!r} is not supported; qkv's rotary embedding is 'default'")
        bases[layer_type] = float(p.get("rope_theta", hf.get(_OLD_THETA[layer_type], default)))
    return bases


def _config(hf: dict[str, Any], source: str, kind: str) -> ModelConfig:
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                           "intermediate_size") if k not in hf]
    if missing:
        raise CheckpointError(f"{source}: missing field(s) {missing}")
    act = activation_from_hf(hf.get("hidden_activation", "gelu"), source, key="hidden_activation")
    head_act = hf.get("classifier_activation", "gelu")
    if activation_from_hf(head_act, source, key="classifier_activation") != act and kind == "masked_lm":
        raise CheckpointError(f"{source}: classifier_activation={head_act!r} differs from hidden_activation="
                              f"{hf.get('hidden_activation', 'gelu')!r}; qkv's masked-LM head applies the "
                              "layers' activation")
    dropout = float(hf.get("embedding_dropout", 0.0))
    if float(hf.get("mlp_dropout", 0.0)) != dropout:
        raise CheckpointError(f"{source}: mlp_dropout={hf.get('mlp_dropout')!r} differs from embedding_dropout="
                              f"{dropout!r}; qkv has one dropout rate for the embeddings and sublayer outputs")
    if hf.get("tie_word_embeddings", True) is not True:
        raise CheckpointError(f"{source}: tie_word_embeddings=False is not supported (qkv ties the decoder "
                              "to the token embeddings)")
    local, every = _layer_pattern(hf, source)
    bases = _rope_bases(hf, source)
    try:
        return ModelConfig.from_flat(
            vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_heads=hf["num_attention_heads"],
            d_ff=hf["intermediate_size"], n_layers=hf["num_hidden_layers"],
            max_len=hf.get("max_position_embeddings", 8192), type_vocab_size=0, activation=act,
            norm="pre", dropout=dropout, attention_dropout=float(hf.get("attention_dropout", 0.0)),
            position="rope", rope_base=bases["full_attention"],
            local_rope_base=bases["sliding_attention"] if local else None,
            local_window=int(hf.get("local_attention", 128)) if local else None, global_every=every,
            layer_norm_eps=float(hf.get("norm_eps", 1e-5)), norm_bias=bool(hf.get("norm_bias", False)),
            attention_bias=bool(hf.get("attention_bias", False)), mlp_bias=bool(hf.get("mlp_bias", False)),
            head_bias=bool(hf.get("classifier_bias", False)), feed_forward="glu", first_attention_norm=False,
            pad_token_id=hf.get("pad_token_id") or 0, initializer_range=float(hf.get("initializer_range", 0.02)),
            family=MODEL_TYPE,
        )
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def read(hf: dict[str, Any], tensors: dict[str, Tensor], *, config_source: str,
         weights_source: str) -> Imported:
    """A Hugging Face ModernBERT checkpoint as qkv's config, kind, task and state dict."""
    kind = kind_from_hf(hf, tensors, config_source, architectures_=ARCHITECTURES, refused=_REFUSED,
                        supported=SUPPORTED, head_prefixes={"masked_lm": ("head.", "decoder.")})
    config = _config(hf, config_source, kind)
    task = None
    if kind in ("sequence_classification", "token_classification"):
        head = {"head": activation_from_hf(hf.get("classifier_activation", "gelu"), config_source,
                                           key="classifier_activation"), "head_norm": True}
        dropout = float(hf.get("classifier_dropout", 0.0))
        if kind == "token_classification":
            task = token_task(hf, config_source, dropout)
            task = TaskConfig(task.task, task.labels, classifier_dropout=dropout, **head)
        else:
            pooling = hf.get("classifier_pooling", "cls")
            if pooling not in ("cls", "mean"):
                raise CheckpointError(f"{config_source}: classifier_pooling={pooling!r} is not supported; "
                                      "allowed: cls, mean")
            task = sequence_task(hf, config_source, dropout=dropout, pooling=pooling, **head)
    plan = _plan(config, kind, task.num_labels if task is not None else 0)
    prefix = "" if kind == "encoder" else "model."
    check_plan(tensors, plan, weights_source, ignored=("decoder.weight", "decoder.bias"),
               owned=(prefix + "embeddings.", prefix + "layers.", prefix + "final_norm.", "head.", "decoder.",
                      "classifier."),
               layers_field="num_hidden_layers", n_layers=config.n_layers,
               unknown=f"a ModernBERT encoder or a head qkv supports ({SUPPORTED})")
    state = state_from_plan(tensors, plan)
    if kind == "masked_lm":
        check_tied(tensors, "decoder.weight", "model.embeddings.tok_embeddings.weight", weights_source,
                   what="the token embeddings")
        bias = tensors.get("decoder.bias")
        if bias is not None and tuple(bias.shape) != (config.vocab_size,):
            raise CheckpointError(f"{weights_source}: tensor 'decoder.bias' has shape {tuple(bias.shape)}, "
                                  f"expected ({config.vocab_size},) from config.json (vocab_size)")
        state["head.bias"] = bias if bias is not None else torch.zeros(config.vocab_size)  # decoder_bias=False
    return Imported(config, kind, task, state)


def config_to_hf(config: ModelConfig, kind: str, task: TaskConfig | None = None) -> dict[str, Any]:
    """The Hugging Face ModernBERT ``config.json`` of a qkv model of ``kind``; raises
    :class:`CheckpointError` naming every option ModernBERT cannot express."""
    refuse_causal_lm(kind, NAME)
    extra = head_reasons(task, NAME, sequence=SEQUENCE_HEAD, token=TOKEN_HEAD)
    if kind not in ARCHITECTURES:
        extra.append(f"kind {kind!r} (qkv writes ModernBERT as {', '.join(ARCHITECTURES.values())})")
    refuse_unexpressible(config, NAME, {
        "norm": "pre", "first_attention_norm": False, "feed_forward": "glu", "position": "rope",
        "type_vocab_size": 0, "position_offset": 0, "embedding_size": None, "pooler": False,
        "local_window": (lambda c: True, "any"), "norm_bias": (lambda c: True, "any"),
        "mlp_bias": (lambda c: True, "any"), "attention_bias": (lambda c: True, "any")}, extra)
    full = {"rope_type": "default", "rope_theta": config.positions.rope_base}
    local = {"rope_type": "default", "rope_theta": config.positions.local_rope_base or config.positions.rope_base}
    every = layer_period(config)
    if every is None:
        raise CheckpointError(f"layer_types={list(config.layer_types)} is not 'a global layer every k layers, the "
                              "first global', which is what ModernBERT expresses; keep it in the qkv format (qkv "
                              "convert --to qkv; qkv.save in Python)")
    types = ["sliding_attention" if config.is_local(i) else "full_attention" for i in range(config.n_layers)]
    head_act = task.head if task is not None and task.head in ACT_TO_HF else config.ffn.activation
    task_part = {}
    if task is not None:
        task_part = {**task_fields(task), "classifier_dropout": task.classifier_dropout}
        if task.is_sequence:
            task_part["classifier_pooling"] = task.pooling
    return {**task_part,
        "architectures": [ARCHITECTURES[kind]] if kind in ARCHITECTURES else [],
        "model_type": MODEL_TYPE,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.ffn.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.attention.n_heads,
        "hidden_activation": ACT_TO_HF[config.ffn.activation],
        "classifier_activation": ACT_TO_HF[head_act],
        "max_position_embeddings": config.max_len,
        "initializer_range": config.initializer_range,
        "norm_eps": config.norm.eps,
        "norm_bias": config.norm.bias,
        "attention_bias": config.attention.bias,
        "mlp_bias": config.ffn.bias,
        "classifier_bias": config.head_bias,
        "decoder_bias": True,
        "attention_dropout": config.attention.dropout,
        "embedding_dropout": config.dropout,
        "mlp_dropout": config.dropout,
        "local_attention": config.attention.window if config.attention.window is not None else 128,
        "global_attn_every_n_layers": every,
        "layer_types": types,
        "rope_parameters": {"full_attention": full, "sliding_attention": local},
        "pad_token_id": config.pad_token_id,
        "bos_token_id": None, "eos_token_id": None, "cls_token_id": None, "sep_token_id": None,
        "tie_word_embeddings": True,
    }


def write(state: dict[str, Tensor], config: ModelConfig, kind: str,
          task: TaskConfig | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json dict, tensors)`` of the Hugging Face ModernBERT checkpoint of a qkv model."""
    hf = config_to_hf(config, kind, task)
    tensors = tensors_from_plan(state, _plan(config, kind, task.num_labels if task is not None else 0))
    if kind == "masked_lm":
        tensors["decoder.bias"] = state["head.bias"].detach().contiguous().clone()
    return hf, tensors
