"""Hugging Face T5 ⇄ qkv (``model_type: t5``; ``T5ForConditionalGeneration``, the original T5's
``relu`` feed-forward with a tied head).

Legend: C ``d_model``, F ``d_ff``, V ``vocab_size``, H ``num_heads``, K
``relative_attention_num_buckets``.

T5 is a pre-norm encoder–decoder, qkv's :class:`~qkv.models.seq2seq.EncoderDecoder` (kind
``"encoder_decoder"``) with RMS norms without biases, no bias in any linear map, unscaled
dot-product attention (similarity ``dot``), no input positions but T5's bucketed relative score
bias (position ``t5``; one-directional buckets in the decoder's self-attention:
``DecoderConfig.causal_buckets``), final norms on both sides, and the tied head applied to the
decoder's output scaled by C^-½ (``DecoderConfig.output_scale``). Names (``E`` =
``encoder.block.N``, ``D`` = ``decoder.block.N``):

* ``shared`` → ``encoder.embeddings.tokens`` (``encoder.embed_tokens``, ``decoder.embed_tokens``
  and ``lm_head``, when stored, must equal it);
* ``E.layer.0.SelfAttention.q/k/v`` → ``encoder.layers.N.attention.qkv_proj`` (rows ``[q; k; v]``),
  ``.o`` → ``out_proj``, ``E.layer.0.layer_norm`` → ``norm1``, ``E.layer.1.DenseReluDense.wi`` /
  ``wo`` → ``feed_forward.linear1`` / ``linear2``, ``E.layer.1.layer_norm`` → ``norm2``;
* ``D.layer.0.SelfAttention`` → ``decoder.layers.N.self_attention`` (fused likewise), ``norm1``;
  ``D.layer.1.EncDecAttention.q`` → ``cross_attention.q_proj``, ``k``/``v`` → ``kv_proj`` (rows
  ``[k; v]``), ``o`` → ``out_proj``, ``D.layer.1.layer_norm`` → ``norm2``; ``D.layer.2`` → the
  feed-forward and ``norm3``;
* ``encoder.block.0.layer.0.SelfAttention.relative_attention_bias (K,H)`` — T5 computes it in the
  first layer and shares it — → every encoder layer's ``attention.score_bias`` (the decoder's
  likewise); written back from layer 0, and refused when the layers' tables differ;
* ``encoder.final_layer_norm`` / ``decoder.final_layer_norm`` → ``encoder.final_norm`` /
  ``decoder.final_norm``.

Refused: a gated feed-forward (``feed_forward_proj: gated-gelu``, T5 v1.1), an untied head
(``tie_word_embeddings: false``), ``d_kv × num_heads ≠ d_model``, different encoder and decoder
depths are read (qkv's decoder has its own depth).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from qkv.checkpoints.families._common import (ACT_TO_HF, Imported, Plan, activation_from_hf, architectures,
                                              check_plan, check_tied, refuse_unexpressible, state_from_plan,
                                              tensors_from_plan)
from qkv.config import ModelConfig
from qkv.errors import CheckpointError
from qkv.models.heads import TaskConfig

MODEL_TYPE = "t5"
NAME = "T5"
ARCHITECTURES = {"encoder_decoder": "T5ForConditionalGeneration"}
SUPPORTED = "T5ForConditionalGeneration (relu or gelu feed-forward, tied head)"
FIELDS = {"C": "d_model", "F": "d_ff", "V": "vocab_size", "K": "relative_attention_num_buckets", "H": "num_heads"}
_TIED = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")
_BIAS = "layer.0.SelfAttention.relative_attention_bias.weight"


def _attention(plan: Plan, hf: str, ours: str, fused_kv: bool) -> None:
    if fused_kv:
        plan.rows.append((f"{hf}.q.weight", f"{ours}.q_proj.weight", "CC"))
        plan.fused.append((f"{ours}.kv_proj.weight", (f"{hf}.k.weight", f"{hf}.v.weight"), "CC"))
    else:
        plan.fused.append((f"{ours}.qkv_proj.weight", tuple(f"{hf}.{a}.weight" for a in "qkv"), "CC"))
    plan.rows.append((f"{hf}.o.weight", f"{ours}.out_proj.weight", "CC"))


def _ffn(plan: Plan, hf: str, ours: str) -> None:
    plan.rows += [(f"{hf}.DenseReluDense.wi.weight", f"{ours}.feed_forward.linear1.weight", "FC"),
                  (f"{hf}.DenseReluDense.wo.weight", f"{ours}.feed_forward.linear2.weight", "CF")]


def _n_decoder(config: ModelConfig) -> int:
    dec = config.decoder
    return (dec.n_layers if dec is not None else None) or config.n_layers


def _plan(config: ModelConfig) -> Plan:
    plan = Plan({"C": config.d_model, "F": config.ffn.d_ff, "V": config.vocab_size,
                 "K": config.positions.num_buckets, "H": config.attention.n_heads}, FIELDS)
    plan.rows.append(("shared.weight", "encoder.embeddings.tokens.weight", "VC"))
    for i in range(config.n_layers):
        hf, ours = f"encoder.block.{i}", f"encoder.layers.{i}"
        _attention(plan, f"{hf}.layer.0.SelfAttention", f"{ours}.attention", False)
        _ffn(plan, f"{hf}.layer.1", ours)
        plan.rows += [(f"{hf}.layer.0.layer_norm.weight", f"{ours}.norm1.weight", "C"),
                      (f"{hf}.layer.1.layer_norm.weight", f"{ours}.norm2.weight", "C")]
    for i in range(_n_decoder(config)):
        hf, ours = f"decoder.block.{i}", f"decoder.layers.{i}"
        _attention(plan, f"{hf}.layer.0.SelfAttention", f"{ours}.self_attention", False)
        _attention(plan, f"{hf}.layer.1.EncDecAttention", f"{ours}.cross_attention", True)
        _ffn(plan, f"{hf}.layer.2", ours)
        plan.rows += [(f"{hf}.layer.{k}.layer_norm.weight", f"{ours}.norm{k + 1}.weight", "C") for k in range(3)]
    plan.rows += [("encoder.final_layer_norm.weight", "encoder.final_norm.weight", "C"),
                  ("decoder.final_layer_norm.weight", "decoder.final_norm.weight", "C")]
    return plan


def _score_biases(config: ModelConfig) -> list[tuple[str, str, int]]:
    """``(Hugging Face name, qkv name prefix, layers)`` of the two shared relative-bias tables."""
    return [(f"encoder.block.0.{_BIAS}", "encoder.layers.{}.attention.score_bias.weight", config.n_layers),
            (f"decoder.block.0.{_BIAS}", "decoder.layers.{}.self_attention.score_bias.weight", _n_decoder(config))]


def _config(hf: dict[str, Any], source: str) -> ModelConfig:
    missing = [k for k in ("vocab_size", "d_model", "d_ff", "num_layers", "num_heads") if k not in hf]
    if missing:
        raise CheckpointError(f"{source}: missing field(s) {missing}")
    proj = hf.get("feed_forward_proj", "relu")
    if hf.get("is_gated_act") or str(proj).startswith("gated-"):
        raise CheckpointError(f"{source}: feed_forward_proj={proj!r} (a gated feed-forward, T5 v1.1) is not "
                              "supported yet; qkv reads T5's relu or gelu feed-forward")
    if not hf.get("tie_word_embeddings", True):
        raise CheckpointError(f"{source}: tie_word_embeddings=false (an untied head) is not supported; qkv ties "
                              "the head to the token table")
    d_kv = hf.get("d_kv", hf["d_model"] // hf["num_heads"])
    if d_kv * hf["num_heads"] != hf["d_model"]:
        raise CheckpointError(f"{source}: d_kv={d_kv} × num_heads={hf['num_heads']} ≠ d_model={hf['d_model']}; "
                              "qkv's heads split the model width")
    eos = hf.get("eos_token_id", 1)
    decoder = {"start_token_id": hf.get("decoder_start_token_id", hf.get("pad_token_id", 0)), "eos_token_id": eos,
               "output_scale": hf["d_model"] ** -0.5, "causal_buckets": True}
    if hf.get("num_decoder_layers") not in (None, hf["num_layers"]):
        decoder["n_layers"] = hf["num_decoder_layers"]
    try:
        return ModelConfig.from_flat(
            vocab_size=hf["vocab_size"], d_model=hf["d_model"], n_heads=hf["num_heads"], d_ff=hf["d_ff"],
            n_layers=hf["num_layers"], max_len=hf.get("n_positions", 512), type_vocab_size=0,
            activation=activation_from_hf(proj, source, "feed_forward_proj"),
            dropout=float(hf.get("dropout_rate", 0.1)),
            layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-6)), norm="pre", norm_type="rmsnorm",
            norm_bias=False, attention_bias=False, mlp_bias=False, similarity="dot", position="t5",
            num_buckets=hf.get("relative_attention_num_buckets", 32),
            max_distance=hf.get("relative_attention_max_distance", 128), embedding_norm=False,
            pad_token_id=hf.get("pad_token_id", 0), decoder=decoder, family=MODEL_TYPE)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{source}: {e}") from e


def read(hf: dict[str, Any], tensors: dict[str, Tensor], *, config_source: str, weights_source: str) -> Imported:
    """A ``T5ForConditionalGeneration`` checkpoint as qkv's config, kind and state dict.

    Raises:
        CheckpointError: another architecture, a missing, mis-shaped, unexpected or unknown tensor,
            an untied head, a config option qkv does not support.
    """
    archs = architectures(hf)
    if archs and archs != ["T5ForConditionalGeneration"]:
        raise CheckpointError(f"{config_source}: architectures={archs!r} is not supported; qkv loads {SUPPORTED}")
    config = _config(hf, config_source)
    plan = _plan(config)
    plan.rows += [(name, ours.format(0), "KH") for name, ours, _ in _score_biases(config)]
    check_plan(tensors, plan, weights_source, ignored=_TIED, owned=("encoder.", "decoder."),
               layers_field="num_layers/num_decoder_layers", n_layers=config.n_layers,
               unknown=f"a T5 model ({SUPPORTED})")
    for name in _TIED:
        check_tied(tensors, name, "shared.weight", weights_source, what="shared.weight")
    state = state_from_plan(tensors, plan)
    for name, ours, n in _score_biases(config):
        for i in range(1, n):
            state[ours.format(i)] = tensors[name]  # T5 shares the first layer's table
    return Imported(config, "encoder_decoder", None, state)


def config_to_hf(config: ModelConfig, kind: str, task: TaskConfig | None = None) -> dict[str, Any]:
    """The ``config.json`` of ``T5ForConditionalGeneration``; raises :class:`CheckpointError`
    naming every option T5 cannot express."""
    extra = [] if kind == "encoder_decoder" else [f"kind {kind!r} (T5 is an encoder-decoder)"]
    dec = config.decoder
    if dec is None or abs(dec.output_scale - config.d_model ** -0.5) > 1e-12 or not dec.causal_buckets:
        extra.append("decoder.output_scale = d_model**-0.5 and decoder.causal_buckets (T5 needs both)")
    if dec is not None and (dec.vocab_size is not None or dec.logits_bias):
        extra.append("one vocabulary and no logits bias (T5 has neither a second table nor a bias)")
    refuse_unexpressible(config, NAME, {"position": "t5", "norm": "pre", "norm_type": "rmsnorm", "norm_bias": False,
                                        "attention_bias": False, "mlp_bias": False, "similarity": "dot",
                                        "embedding_norm": False, "position_offset": 0,
                                        "activation": (lambda c: c.ffn.activation in ("relu", "gelu"), "relu or gelu"),
                                        "type_vocab_size": 0, "embedding_size": None, "pooler": False}, extra)
    n_dec = _n_decoder(config)
    return {"architectures": [ARCHITECTURES["encoder_decoder"]], "model_type": MODEL_TYPE,
            "vocab_size": config.vocab_size, "d_model": config.d_model,
            "d_kv": config.d_model // config.attention.n_heads,
            "d_ff": config.ffn.d_ff, "num_layers": config.n_layers, "num_decoder_layers": n_dec,
            "num_heads": config.attention.n_heads, "relative_attention_num_buckets": config.positions.num_buckets,
            "relative_attention_max_distance": config.positions.max_distance, "dropout_rate": config.dropout,
            "layer_norm_epsilon": config.norm.eps, "feed_forward_proj": ACT_TO_HF[config.ffn.activation],
            "is_encoder_decoder": True, "tie_word_embeddings": True, "use_cache": True,
            "pad_token_id": config.pad_token_id, "eos_token_id": dec.eos_token_id,
            "decoder_start_token_id": dec.start_token_id, "n_positions": config.max_len}


def write(state: dict[str, Tensor], config: ModelConfig, kind: str,
          task: TaskConfig | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json dict, tensors)`` of the ``T5ForConditionalGeneration`` checkpoint (the shared
    relative-bias tables from layer 0; refused when the layers' tables differ)."""
    hf = config_to_hf(config, kind, task)
    out = tensors_from_plan(state, _plan(config))
    for name, ours, n in _score_biases(config):
        first = state[ours.format(0)]
        if any(not torch.equal(state[ours.format(i)], first) for i in range(1, n)):
            raise CheckpointError(f"this model cannot be exported as a Hugging Face T5: its layers' relative-bias "
                                  f"tables ({ours.format('N')}) differ, T5 shares one; keep it in the qkv format")
        out[name] = first.detach().contiguous().clone()
    return hf, out
