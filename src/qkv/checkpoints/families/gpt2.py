"""Hugging Face GPT-2 ⇄ qkv (``model_type: gpt2``; Radford et al. 2019).

Legend: C ``n_embd``, F ``n_inner`` (``None`` = 4C), V vocabulary, P ``n_positions``.

GPT-2 is a pre-LN causal stack, qkv's :class:`~qkv.models.causal_lm.CausalLM` (kind
``"causal_lm"``) with ``norm="pre"``, learned positions, no segment embeddings
(``type_vocab_size=0``), no norm on the embedding sum (``embedding_norm=False``), no padding row
(``pad_token_id=None``) and a final norm. Names (under ``transformer.`` in a
``GPT2LMHeadModel``, bare in a ``GPT2Model`` and in older ``GPT2LMHeadModel`` checkpoints):

* ``wte`` → ``decoder.embeddings.tokens``, ``wpe`` → ``decoder.embeddings.positions``;
* ``h.N.ln_1`` / ``ln_2`` → ``decoder.layers.N.norm1`` / ``norm2``, ``ln_f`` → ``decoder.final_norm``;
* ``h.N.attn.c_attn`` (columns ``[q | k | v]``) → ``attention.qkv_proj`` (rows ``[q; k; v]``),
  ``attn.c_proj`` → ``attention.out_proj``, ``mlp.c_fc`` / ``mlp.c_proj`` →
  ``feed_forward.linear1`` / ``linear2``. These are transformers' ``Conv1D`` maps, whose weight
  is stored ``(in, out)``: transposed to ``nn.Linear``'s ``(out, in)`` on the way in and back on
  the way out.
* ``lm_head.weight`` is tied to ``wte`` (qkv's head is ``h · Eᵀ``): when present it must equal
  ``wte``; ``tie_word_embeddings: false`` is refused. A ``GPT2Model`` folder has no head and loads
  as the same causal LM (the head has no weights of its own).
* the causal-mask buffers older checkpoints carry (``h.N.attn.bias``, ``h.N.attn.masked_bias``)
  are ignored.

Config: ``activation_function`` (``gelu_new`` → ``gelu_tanh``, ``gelu``, ``relu``,
``silu``/``swish``), ``layer_norm_epsilon``, ``n_inner``, ``n_positions`` → ``max_len``,
``attn_pdrop`` → ``attention_dropout``, ``resid_pdrop`` → ``dropout`` (GPT-2's embedding
dropout ``embd_pdrop`` must be the same rate: qkv has one rate for the embeddings and the
sublayer outputs; a checkpoint where they differ is refused). ``scale_attn_weights: false``
(scores ``qᵀk`` without ``1/√D``) reads as ``similarity="dot"``. ``reorder_and_upcast_attn``
is accepted and not kept: it only makes transformers' eager attention compute the scores in
float32 under mixed precision (its default SDPA attention ignores it too); in float32 the
outputs are the same. ``pad_token_id`` / ``bos_token_id`` / ``eos_token_id`` are not kept
(GPT-2's embedding has no padding row; pass the ids to ``generate``).

Refused, naming the field or the architecture: ``scale_attn_by_inverse_layer_idx: true``,
``add_cross_attention: true``, an activation other than those above,
``GPT2ForSequenceClassification``, ``GPT2ForTokenClassification``, ``GPT2DoubleHeadsModel``,
``GPT2ForQuestionAnswering`` (a head qkv does not have is never dropped).

Written: ``GPT2LMHeadModel`` (weights under ``transformer.``, the tied ``lm_head`` not stored),
for kind ``"causal_lm"`` only; every option GPT-2 cannot express is refused by name.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from qkv.config import ModelConfig
from qkv.errors import CheckpointError
from qkv.checkpoints.families._common import (Imported, Plan, activation_from_hf, architectures, check_plan,
                                         check_tied, refuse_unexpressible, state_from_plan, tensors_from_plan)
from qkv.models.heads import TaskConfig

MODEL_TYPE = "gpt2"
NAME = "GPT-2"
ARCHITECTURES = {"causal_lm": "GPT2LMHeadModel"}
#: The architectures read, all as kind ``"causal_lm"`` (GPT2Model: the tied head needs no weights).
READ = ("GPT2LMHeadModel", "GPT2Model")
_REFUSED = {"GPT2ForSequenceClassification": "its sequence classification head (score.*)",
            "GPT2ForTokenClassification": "its token classification head (classifier.*)",
            "GPT2DoubleHeadsModel": "its multiple-choice head (multiple_choice_head.*)",
            "GPT2ForQuestionAnswering": "its question-answering head (qa_outputs.*)"}
#: Prefixes of the refused heads' tensors, for a checkpoint without ``architectures``.
_HEAD_TENSORS = {"score.": "GPT2ForSequenceClassification", "classifier.": "GPT2ForTokenClassification",
                 "multiple_choice_head.": "GPT2DoubleHeadsModel", "qa_outputs.": "GPT2ForQuestionAnswering"}
SUPPORTED = "GPT2LMHeadModel and GPT2Model (both as a causal LM with the head tied to wte)"
ACT_TO_GPT2 = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}
FIELDS = {"C": "n_embd", "Q": "3 × n_embd", "F": "n_inner", "V": "vocab_size", "P": "n_positions"}
_LM_HEAD = "lm_head.weight"
#: (Hugging Face name in a block, qkv name in a layer, symbolic shape as stored by Hugging Face)
_LAYER = [
    ("ln_1.weight", "norm1.weight", "C"), ("ln_1.bias", "norm1.bias", "C"),
    ("attn.c_attn.weight", "attention.qkv_proj.weight", "CQ"),
    ("attn.c_attn.bias", "attention.qkv_proj.bias", "Q"),
    ("attn.c_proj.weight", "attention.out_proj.weight", "CC"),
    ("attn.c_proj.bias", "attention.out_proj.bias", "C"),
    ("ln_2.weight", "norm2.weight", "C"), ("ln_2.bias", "norm2.bias", "C"),
    ("mlp.c_fc.weight", "feed_forward.linear1.weight", "CF"),
    ("mlp.c_fc.bias", "feed_forward.linear1.bias", "F"),
    ("mlp.c_proj.weight", "feed_forward.linear2.weight", "FC"),
    ("mlp.c_proj.bias", "feed_forward.linear2.bias", "C"),
]
#: The Conv1D weights (stored (in, out)): qkv name suffixes transposed on the way in and out.
_CONV1D = ("attention.qkv_proj.weight", "attention.out_proj.weight", "feed_forward.linear1.weight",
           "feed_forward.linear2.weight")
_BUFFERS = ("attn.bias", "attn.masked_bias")  # older checkpoints' causal-mask buffers: ignored


def _plan(config: ModelConfig, prefix: str) -> Plan:
    """The tensors of a GPT-2 checkpoint, Hugging Face names under ``prefix`` (``"transformer."``
    in a ``GPT2LMHeadModel``), shapes as Hugging Face stores them."""
    plan = Plan({"C": config.d_model, "Q": 3 * config.d_model, "F": config.ffn.d_ff, "V": config.vocab_size,
                 "P": config.max_len}, FIELDS)
    plan.rows += [(prefix + "wte.weight", "decoder.embeddings.tokens.weight", "VC"),
                  (prefix + "wpe.weight", "decoder.embeddings.positions.weight", "PC")]
    for i in range(config.n_layers):
        plan.rows += [(f"{prefix}h.{i}.{hf}", f"decoder.layers.{i}.{ours}", sym) for hf, ours, sym in _LAYER]
    plan.rows += [(prefix + "ln_f.weight", "decoder.final_norm.weight", "C"),
                  (prefix + "ln_f.bias", "decoder.final_norm.bias", "C")]
    return plan


def _transposed(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """``state`` with every Conv1D weight transposed (``(in, out)`` ⇄ ``(out, in)``)."""
    return {k: v.t() if k.endswith(_CONV1D) else v for k, v in state.items()}


def _check_head(hf: dict[str, Any], names, source: str) -> None:
    """Only a language-model head (or none) is read; any other GPT-2 head is refused by name."""
    archs = architectures(hf)
    for arch in archs:
        if arch in _REFUSED:
            raise CheckpointError(f"{source}: {arch}: {_REFUSED[arch]} is not supported; qkv loads "
                                  f"{SUPPORTED}, and never drops a head silently")
    if len(archs) > 1 or (archs and archs[0] not in READ):
        raise CheckpointError(f"{source}: architectures={archs!r} is not supported; qkv loads {SUPPORTED}")
    for name in sorted(names):
        for pre, arch in _HEAD_TENSORS.items():
            if name.startswith(pre):
                raise CheckpointError(f"{source}: the weights hold {_REFUSED[arch]} ({name!r}, {arch}); qkv "
                                      f"loads {SUPPORTED}, and never drops a head silently")


def _config(hf: dict[str, Any], source: str) -> ModelConfig:
    missing = [k for k in ("vocab_size", "n_embd", "n_layer", "n_head") if k not in hf]
    if missing:
        raise CheckpointError(f"{source}: missing field(s) {missing}")
    for key, why in (("scale_attn_by_inverse_layer_idx", "scores scaled by 1/(layer index + 1)"),
                     ("add_cross_attention", "cross-attention blocks (an encoder-decoder)")):
        if hf.get(key, False) is not False:
            raise CheckpointError(f"{source}: {key}={hf[key]!r} is not supported ({why}); qkv reads "
                                  f"{key}=false")
    if hf.get("tie_word_embeddings", True) is not True:
        raise CheckpointError(f"{source}: tie_word_embeddings={hf['tie_word_embeddings']!r} is not supported "
                              "(qkv's LM head is tied to the token embeddings wte)")
    scaled = hf.get("scale_attn_weights", True)
    if not isinstance(scaled, bool):
        raise CheckpointError(f"{source}: scale_attn_weights={scaled!r} must be true or false")
    act = activation_from_hf(hf.get("activation_function", "gelu_new"), source, key="activation_function")
    dropout, embd = hf.get("resid_pdrop", 0.1), hf.get("embd_pdrop", 0.1)
    if dropout != embd:
        raise CheckpointError(f"{source}: embd_pdrop={embd!r} differs from resid_pdrop={dropout!r}; qkv has "
                              "one dropout rate for the embeddings and sublayer outputs: set both alike")
    width = hf["n_embd"]
    inner = hf.get("n_inner")
    try:
        return ModelConfig.from_flat(
            vocab_size=hf["vocab_size"], d_model=width, n_heads=hf["n_head"],
            d_ff=4 * width if inner is None else inner, n_layers=hf["n_layer"],
            max_len=hf.get("n_positions", 1024), type_vocab_size=0, activation=act, norm="pre",
            dropout=float(dropout), attention_dropout=float(hf.get("attn_pdrop", 0.1)), position="learned",
            similarity="scaled_dot" if scaled else "dot",
            layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
            pad_token_id=None, embedding_norm=False,
            initializer_range=float(hf.get("initializer_range", 0.02)), family=MODEL_TYPE,
        )
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{source}: {e}") from e


def read(hf: dict[str, Any], tensors: dict[str, Tensor], *, config_source: str,
         weights_source: str) -> Imported:
    """A Hugging Face GPT-2 checkpoint (``GPT2LMHeadModel`` or ``GPT2Model``) as qkv's config, kind
    ``"causal_lm"`` and state dict.

    Raises:
        CheckpointError: a missing, mis-shaped, unexpected or unknown tensor, an untied
            ``lm_head``, a head or config option qkv does not support.
    """
    _check_head(hf, tensors, config_source)
    config = _config(hf, config_source)
    prefix = "transformer." if any(n.startswith("transformer.") for n in tensors) else ""
    plan = _plan(config, prefix)
    buffers = tuple(f"{prefix}h.{i}.{b}" for i in range(config.n_layers) for b in _BUFFERS)
    check_plan(tensors, plan, weights_source, ignored=buffers + (_LM_HEAD,),
               owned=(prefix + "wte.", prefix + "wpe.", prefix + "h.", prefix + "ln_f."),
               layers_field="n_layer", n_layers=config.n_layers,
               unknown=f"a GPT-2 model or its tied LM head ({SUPPORTED})")
    lm_head = tensors.get(_LM_HEAD)
    if lm_head is not None and tuple(lm_head.shape) != plan.shape("VC"):
        raise CheckpointError(f"{weights_source}: tensor {_LM_HEAD!r} has shape {tuple(lm_head.shape)}, "
                              f"expected {plan.shape('VC')} from config.json (vocab_size, n_embd)")
    check_tied(tensors, _LM_HEAD, prefix + "wte.weight", weights_source, what="the token embeddings wte")
    return Imported(config, "causal_lm", None, _transposed(state_from_plan(tensors, plan)))


def config_to_hf(config: ModelConfig, kind: str, task: TaskConfig | None = None) -> dict[str, Any]:
    """The Hugging Face GPT-2 ``config.json`` (``GPT2LMHeadModel``) of a qkv causal LM; raises
    :class:`CheckpointError` naming every option GPT-2 cannot express."""
    extra = []
    if kind != "causal_lm" or task is not None:
        extra.append(f"kind {kind!r} (GPT-2 is a causal language model: qkv writes GPT2LMHeadModel from kind "
                     "'causal_lm' only)")
    refuse_unexpressible(config, NAME, {
        "norm": "pre", "type_vocab_size": 0, "embedding_norm": False, "position_offset": 0,
        "embedding_size": (lambda c: c.embedding_size in (None, c.d_model), f"{config.d_model} = n_embd"),
        "pooler": False,
        "similarity": (lambda c: c.attention.similarity in ("scaled_dot", "dot"),
                       "'scaled_dot', or 'dot' (scale_attn_weights=false)"),
        "activation": (lambda c: c.ffn.activation in ACT_TO_GPT2, f"one of {', '.join(ACT_TO_GPT2)}")}, extra)
    return {
        "architectures": [ARCHITECTURES["causal_lm"]],
        "model_type": MODEL_TYPE,
        "vocab_size": config.vocab_size,
        "n_positions": config.max_len,
        "n_embd": config.d_model,
        "n_layer": config.n_layers,
        "n_head": config.attention.n_heads,
        "n_inner": config.ffn.d_ff,
        "activation_function": ACT_TO_GPT2[config.ffn.activation],
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.attention.dropout,
        "layer_norm_epsilon": config.norm.eps,
        "initializer_range": config.initializer_range,
        "scale_attn_weights": config.attention.similarity == "scaled_dot",
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        "pad_token_id": config.pad_token_id,
        "bos_token_id": None,
        "eos_token_id": None,
        "tie_word_embeddings": True,
        "use_cache": True,
    }


def write(state: dict[str, Tensor], config: ModelConfig, kind: str,
          task: TaskConfig | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json dict, tensors)`` of the Hugging Face ``GPT2LMHeadModel`` checkpoint of a qkv
    causal LM (``lm_head.weight`` not stored: transformers ties it to ``wte``)."""
    hf = config_to_hf(config, kind, task)
    return hf, tensors_from_plan(_transposed(state), _plan(config, "transformer."))
