"""What Marian and BART share: the same post-LN encoder–decoder layers under the same tensor names.

Legend: C ``d_model``, F ``encoder_ffn_dim`` (= ``decoder_ffn_dim``), V ``vocab_size``, W the
target vocabulary (Marian's ``decoder_vocab_size``), P rows of a position table.

Names (under ``model.``; ``E`` = ``encoder.layers.N``, ``D`` = ``decoder.layers.N``):

* ``E.self_attn.q_proj`` / ``k_proj`` / ``v_proj`` → ``encoder.layers.N.attention.qkv_proj``
  (rows ``[q; k; v]``), ``E.self_attn.out_proj`` → ``attention.out_proj``,
  ``E.self_attn_layer_norm`` → ``norm1``, ``E.fc1`` / ``fc2`` → ``feed_forward.linear1`` /
  ``linear2``, ``E.final_layer_norm`` → ``norm2``;
* ``D.self_attn.*`` → ``decoder.layers.N.self_attention.*`` (fused likewise),
  ``D.self_attn_layer_norm`` → ``norm1``, ``D.encoder_attn.q_proj`` → ``cross_attention.q_proj``,
  ``D.encoder_attn.k_proj`` / ``v_proj`` → ``cross_attention.kv_proj`` (rows ``[k; v]``),
  ``D.encoder_attn.out_proj`` → ``cross_attention.out_proj``, ``D.encoder_attn_layer_norm`` →
  ``norm2``, ``D.fc1`` / ``fc2`` → ``feed_forward``, ``D.final_layer_norm`` → ``norm3``;
* ``final_logits_bias (1,W)`` → ``logits_bias (W,)``; ``lm_head.weight`` is tied to the decoder's
  token table (when present it must equal it).

The family modules add their embeddings (tokens, positions, norms) and config fields.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from qkv.checkpoints.families._common import ACT_TO_HF, Plan, activation_from_hf, check_tied
from qkv.config import ModelConfig
from qkv.errors import CheckpointError

__all__ = ["NEEDS", "FIELDS", "layer_rows", "base_plan", "model_fields", "config_fields", "LM_HEAD", "LOGITS_BIAS",
           "check_head", "bias_in", "bias_out", "refuse_different"]

FIELDS = {"C": "d_model", "Q": "d_model", "F": "encoder_ffn_dim", "V": "vocab_size", "W": "decoder_vocab_size",
          "P": "max_position_embeddings", "O": "1"}
LM_HEAD = "lm_head.weight"
#: What both families need of a qkv model beyond the plain fields (:func:`refuse_unexpressible`'s ``needs``).
NEEDS = {"type_vocab_size": 0, "embedding_size": None, "pooler": False, "norm": "post",
         "embed_scale": (lambda c: True, "either value")}
LOGITS_BIAS = "final_logits_bias"
_ATTN = ("q_proj", "k_proj", "v_proj")
_FFN = [("fc1.weight", "feed_forward.linear1.weight", "FC"), ("fc1.bias", "feed_forward.linear1.bias", "F"),
        ("fc2.weight", "feed_forward.linear2.weight", "CF"), ("fc2.bias", "feed_forward.linear2.bias", "C")]


def _norm(hf: str, ours: str) -> list[tuple[str, str, str]]:
    return [(f"{hf}.weight", f"{ours}.weight", "C"), (f"{hf}.bias", f"{ours}.bias", "C")]


def _self_attention(plan: Plan, hf: str, ours: str) -> None:
    for p in ("weight", "bias"):
        plan.fused.append((f"{ours}.qkv_proj.{p}", tuple(f"{hf}.{a}.{p}" for a in _ATTN),
                           "CC" if p == "weight" else "C"))
    plan.rows += [(f"{hf}.out_proj.weight", f"{ours}.out_proj.weight", "CC"),
                  (f"{hf}.out_proj.bias", f"{ours}.out_proj.bias", "C")]


def layer_rows(plan: Plan, config: ModelConfig, n_decoder: int) -> None:
    """Every encoder and decoder layer's rows and fused rows into ``plan``."""
    for i in range(config.n_layers):
        hf, ours = f"model.encoder.layers.{i}", f"encoder.layers.{i}"
        _self_attention(plan, f"{hf}.self_attn", f"{ours}.attention")
        plan.rows += _norm(f"{hf}.self_attn_layer_norm", f"{ours}.norm1") + _norm(f"{hf}.final_layer_norm",
                                                                                   f"{ours}.norm2")
        plan.rows += [(f"{hf}.{a}", f"{ours}.{b}", s) for a, b, s in _FFN]
    for i in range(n_decoder):
        hf, ours = f"model.decoder.layers.{i}", f"decoder.layers.{i}"
        _self_attention(plan, f"{hf}.self_attn", f"{ours}.self_attention")
        x = f"{hf}.encoder_attn"
        plan.rows += [(f"{x}.q_proj.weight", f"{ours}.cross_attention.q_proj.weight", "CC"),
                      (f"{x}.q_proj.bias", f"{ours}.cross_attention.q_proj.bias", "C"),
                      (f"{x}.out_proj.weight", f"{ours}.cross_attention.out_proj.weight", "CC"),
                      (f"{x}.out_proj.bias", f"{ours}.cross_attention.out_proj.bias", "C")]
        plan.fused += [(f"{ours}.cross_attention.kv_proj.weight", (f"{x}.k_proj.weight", f"{x}.v_proj.weight"), "CC"),
                       (f"{ours}.cross_attention.kv_proj.bias", (f"{x}.k_proj.bias", f"{x}.v_proj.bias"), "C")]
        plan.rows += (_norm(f"{hf}.self_attn_layer_norm", f"{ours}.norm1")
                      + _norm(f"{x}_layer_norm", f"{ours}.norm2") + _norm(f"{hf}.final_layer_norm", f"{ours}.norm3"))
        plan.rows += [(f"{hf}.{a}", f"{ours}.{b}", s) for a, b, s in _FFN]


def base_plan(config: ModelConfig, positions: int) -> Plan:
    """A plan with the sizes of ``config`` and every layer's rows (``positions``: rows P)."""
    dec = config.decoder
    target = config.vocab_size if dec is None or dec.vocab_size is None else dec.vocab_size
    plan = Plan({"C": config.d_model, "Q": config.d_model, "F": config.ffn.d_ff, "V": config.vocab_size, "W": target,
                 "P": positions, "O": 1}, FIELDS)
    layer_rows(plan, config, (dec.n_layers if dec is not None else None) or config.n_layers)
    return plan


def refuse_different(hf: dict[str, Any], source: str, pairs: tuple[tuple[str, str], ...]) -> None:
    """qkv's encoder and decoder share their heads and feed-forward width: each pair must agree."""
    for a, b in pairs:
        if a in hf and b in hf and hf[a] != hf[b]:
            raise CheckpointError(f"{source}: {a}={hf[a]!r} differs from {b}={hf[b]!r}; qkv's encoder and decoder "
                                  "share that size")


def model_fields(hf: dict[str, Any], source: str) -> dict[str, Any]:
    """The :class:`ModelConfig` fields (flat names) both families read the same way."""
    missing = [k for k in ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                           "encoder_ffn_dim") if k not in hf]
    if missing:
        raise CheckpointError(f"{source}: missing field(s) {missing}")
    refuse_different(hf, source, (("encoder_attention_heads", "decoder_attention_heads"),
                                  ("encoder_ffn_dim", "decoder_ffn_dim")))
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
        if hf.get(key, 0.0):
            raise CheckpointError(f"{source}: {key}={hf[key]!r} is not supported (qkv never skips a layer); "
                                  "set it to 0")
    eos = hf.get("eos_token_id")
    if eos is not None and not isinstance(eos, int):
        raise CheckpointError(f"{source}: eos_token_id={eos!r}: qkv reads one end token (an int)")
    decoder = {"start_token_id": hf.get("decoder_start_token_id", hf.get("pad_token_id", 0)), "eos_token_id": eos,
               "logits_bias": True}
    if hf["decoder_layers"] != hf["encoder_layers"]:
        decoder["n_layers"] = hf["decoder_layers"]
    return dict(vocab_size=hf["vocab_size"], d_model=hf["d_model"], n_heads=hf["encoder_attention_heads"],
                d_ff=hf["encoder_ffn_dim"], n_layers=hf["encoder_layers"],
                max_len=hf.get("max_position_embeddings", 1024), type_vocab_size=0,
                activation=activation_from_hf(hf.get("activation_function", "gelu"), source, "activation_function"),
                dropout=float(hf.get("dropout", 0.1)), attention_dropout=float(hf.get("attention_dropout", 0.0)),
                layer_norm_eps=1e-5, norm="post", embed_scale=bool(hf.get("scale_embedding", False)),
                pad_token_id=hf.get("pad_token_id"), initializer_range=float(hf.get("init_std", 0.02)),
                decoder=decoder)


def config_fields(config: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` fields both families write the same way."""
    dec = config.decoder
    n_dec = (dec.n_layers if dec is not None else None) or config.n_layers
    return {"vocab_size": config.vocab_size, "d_model": config.d_model, "encoder_layers": config.n_layers,
            "decoder_layers": n_dec, "encoder_attention_heads": config.attention.n_heads,
            "decoder_attention_heads": config.attention.n_heads, "encoder_ffn_dim": config.ffn.d_ff,
            "decoder_ffn_dim": config.ffn.d_ff, "activation_function": ACT_TO_HF.get(config.ffn.activation),
            "max_position_embeddings": config.max_len, "dropout": config.dropout,
            "attention_dropout": config.attention.dropout, "activation_dropout": 0.0, "encoder_layerdrop": 0.0,
            "decoder_layerdrop": 0.0, "scale_embedding": config.embed_scale, "init_std": config.initializer_range,
            "pad_token_id": config.pad_token_id, "eos_token_id": None if dec is None else dec.eos_token_id,
            "decoder_start_token_id": 1 if dec is None else dec.start_token_id, "is_encoder_decoder": True,
            "tie_word_embeddings": True, "use_cache": True, "forced_eos_token_id": None}


def check_head(tensors: dict[str, Tensor], table: str, source: str) -> None:
    """``lm_head.weight``, when stored, must be the decoder's token table ``table``."""
    check_tied(tensors, LM_HEAD, table, source, what=f"the decoder's token table {table}")


def bias_in(tensors: dict[str, Tensor], target: int, source: str) -> Tensor:
    """``final_logits_bias (1,W)`` → ``(W,)`` (zeros when the checkpoint has none: transformers' default)."""
    t = tensors.get(LOGITS_BIAS)
    if t is None:
        return tensors[next(iter(tensors))].new_zeros(target)
    if tuple(t.shape) != (1, target):
        raise CheckpointError(f"{source}: tensor {LOGITS_BIAS!r} has shape {tuple(t.shape)}, expected (1, {target})")
    return t.reshape(-1)


def bias_out(state: dict[str, Tensor], target: int) -> Tensor:
    """qkv's ``logits_bias (W,)`` → ``final_logits_bias (1,W)`` (zeros for a model without one)."""
    bias = state.get("logits_bias")
    if bias is None:
        return next(iter(state.values())).new_zeros(1, target)
    return bias.detach().reshape(1, -1).contiguous().clone()
