"""Hugging Face BERT ⇄ qkv conversion. The only module that knows Hugging Face tensor names.

Legend: C hidden size, F intermediate size, V vocabulary, P position table size, S segment ids.

Config fields map one to one (``hidden_size`` → ``d_model``, …). Tensors map by name, except the
separate query/key/value maps, which qkv fuses into one ``qkv_proj`` with rows ``[q; k; v]``.
Ignored on import: the pooler, the next-sentence head, position/token-type id buffers, other
task heads outside the encoder; the MLM decoder weight must equal the word embeddings (tied).
Every tensor inside the encoder and MLM head is checked for presence and shape against
``config.json`` before anything is copied.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from qkv.config import ModelConfig
from qkv.models.errors import CheckpointError

__all__ = ["config_from_hf", "config_to_hf", "state_dict_from_hf", "state_dict_to_hf", "has_mlm_head"]

_ACT_FROM_HF = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
_ACT_TO_HF = {"gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_pytorch_tanh"}
_DIM_FIELDS = {"C": "hidden_size", "F": "intermediate_size", "V": "vocab_size",
               "P": "max_position_embeddings", "S": "type_vocab_size"}

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
_IGNORED_ENCODER = ("embeddings.position_ids", "embeddings.token_type_ids")


def config_from_hf(hf: dict[str, Any], *, source: str = "config.json") -> ModelConfig:
    """A :class:`ModelConfig` from a Hugging Face BERT ``config.json`` dict."""
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
        )
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def config_to_hf(config: ModelConfig, *, masked_lm: bool) -> dict[str, Any]:
    """A Hugging Face BERT ``config.json`` dict; raises if ``config`` is not expressible in BERT."""
    bert = {"position": "learned", "position_qk_only": False, "similarity": "scaled_dot",
            "similarity_kwargs": {}, "qkv_proj": True, "out_proj": True, "attention_bias": True,
            "norm": "post"}
    bad = [f"{k}={getattr(config, k)!r} (BERT needs {v!r})"
           for k, v in bert.items() if getattr(config, k) != v]
    if config.type_vocab_size < 1:
        bad.append("type_vocab_size=0 (BERT needs ≥ 1)")
    if bad:
        raise CheckpointError("this model cannot be exported as a Hugging Face BERT: " + "; ".join(bad))
    return {
        "architectures": ["BertForMaskedLM" if masked_lm else "BertModel"],
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


def _prefix(names) -> str:
    return "bert." if any(n.startswith("bert.") for n in names) else ""


def has_mlm_head(names) -> bool:
    """Whether a set of Hugging Face tensor names includes the masked-LM head."""
    return any(n.startswith(_HEAD + "transform.") for n in names)


def _rename_legacy(name: str) -> str:
    """TF-converted checkpoints name LayerNorm parameters gamma/beta."""
    if "LayerNorm." in name:
        return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
    return name


def _expected(config: ModelConfig, masked_lm: bool, prefix: str) -> dict[str, str]:
    """Hugging Face name → symbolic shape, for every tensor the conversion needs."""
    out = {prefix + hf: shape for hf, _, shape in _EMBEDDINGS}
    for i in range(config.n_layers):
        for hf, shape in _QKV:
            out[f"{prefix}encoder.layer.{i}.{hf}"] = shape
        for hf, _, shape in _LAYER:
            out[f"{prefix}encoder.layer.{i}.{hf}"] = shape
    if masked_lm:
        out.update({hf: shape for hf, _, shape in _MLM})
    return out


def _check(tensors: dict[str, Tensor], config: ModelConfig, masked_lm: bool, prefix: str, source: str):
    dims = {"C": config.d_model, "F": config.d_ff, "V": config.vocab_size, "P": config.max_len,
            "S": config.type_vocab_size}
    expected = _expected(config, masked_lm, prefix)
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
    ours = (prefix + "embeddings.", prefix + "encoder.", _HEAD)
    ignored = tuple(prefix + n for n in _IGNORED_ENCODER) + (_HEAD + "decoder.",)
    for name in tensors:
        if name.startswith(ours) and name not in expected and not name.startswith(ignored):
            raise CheckpointError(
                f"{source}: unexpected tensor {name!r} for config.json (num_hidden_layers="
                f"{config.n_layers}); the config disagrees with the weights")


def state_dict_from_hf(tensors: dict[str, Tensor], config: ModelConfig, *, masked_lm: bool,
                       source: str = "weights") -> dict[str, Tensor]:
    """qkv state dict (of :class:`MaskedLM` if ``masked_lm`` else :class:`Encoder`) from HF tensors.

    Raises:
        CheckpointError: a missing, mis-shaped or unexpected tensor, or an untied decoder.
    """
    tensors = {_rename_legacy(k): v for k, v in tensors.items()}
    prefix = _prefix(tensors)
    _check(tensors, config, masked_lm, prefix, source)
    enc = "encoder." if masked_lm else ""
    out = {enc + ours: tensors[prefix + hf] for hf, ours, _ in _EMBEDDINGS}
    for i in range(config.n_layers):
        hf_layer, layer = f"{prefix}encoder.layer.{i}.", f"{enc}layers.{i}."
        for hf, ours, _ in _LAYER:
            out[layer + ours] = tensors[hf_layer + hf]
        for p in ("weight", "bias"):
            q, k, v = (tensors[f"{hf_layer}attention.self.{n}.{p}"] for n in ("query", "key", "value"))
            out[f"{layer}attention.qkv_proj.{p}"] = torch.cat([q, k, v], dim=0)  # 3 × (C,…) -> (3C,…)
    if masked_lm:
        out.update({ours: tensors[hf] for hf, ours, _ in _MLM})
        word = tensors[prefix + "embeddings.word_embeddings.weight"]
        decoder = tensors.get(_HEAD + "decoder.weight")
        if decoder is not None and not torch.equal(decoder, word):
            raise CheckpointError(f"{source}: {_HEAD}decoder.weight differs from the word embeddings; "
                                  "qkv ties them (untied decoders are not supported)")
    return out


def state_dict_to_hf(state: dict[str, Tensor], config: ModelConfig, *, masked_lm: bool) -> dict[str, Tensor]:
    """Hugging Face tensors (``BertForMaskedLM`` names if ``masked_lm`` else ``BertModel``) from a
    qkv state dict. Each output tensor is contiguous and owns its memory (safetensors needs it)."""
    config_to_hf(config, masked_lm=masked_lm)  # raises if not expressible
    prefix, enc = ("bert.", "encoder.") if masked_lm else ("", "")
    out = {prefix + hf: state[enc + ours] for hf, ours, _ in _EMBEDDINGS}
    for i in range(config.n_layers):
        hf_layer, layer = f"{prefix}encoder.layer.{i}.", f"{enc}layers.{i}."
        for hf, ours, _ in _LAYER:
            out[hf_layer + hf] = state[layer + ours]
        for p in ("weight", "bias"):
            parts = state[f"{layer}attention.qkv_proj.{p}"].chunk(3, dim=0)  # (3C,…) -> 3 × (C,…)
            for n, t in zip(("query", "key", "value"), parts):
                out[f"{hf_layer}attention.self.{n}.{p}"] = t
    if masked_lm:
        out.update({hf: state[ours] for hf, ours, _ in _MLM})
    return {k: v.detach().contiguous().clone() for k, v in out.items()}
