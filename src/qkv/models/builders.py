"""Builders: the only code that reads a :class:`~qkv.config.ModelConfig` and makes modules.

``build_encoder(config)`` and ``build_masked_lm(config)`` assemble plain-argument modules from
:mod:`qkv.nn` and initialise them as BERT does (normal(0, ``initializer_range``) for linear and
embedding weights, zero biases, unit LayerNorms, a zero padding row).
"""

from __future__ import annotations

import torch
from torch import nn

from qkv.config import ModelConfig
from qkv.nn.attention import MultiHeadAttention
from qkv.nn.encoder import Embeddings, Encoder
from qkv.nn.layer import FeedForward, TransformerLayer
from qkv.nn.positional import build_positions

__all__ = ["build_encoder", "build_masked_lm", "build_model", "init_weights"]


def build_layer(config: ModelConfig, slots) -> TransformerLayer:
    """One transformer layer; position slots give each layer its own q/k transform and bias."""
    attention = MultiHeadAttention(
        config.d_model,
        config.n_heads,
        similarity=config.similarity,
        similarity_kwargs=dict(config.similarity_kwargs),
        qkv_proj=config.qkv_proj,
        out_proj=config.out_proj,
        bias=config.attention_bias,
        dropout=config.attention_dropout,
        qk_transform=slots.make_qk_transform(),
        score_bias=slots.make_score_bias(),
        path=config.attention_path,
        chunk_size=config.chunk_size,
    )
    feed_forward = FeedForward(config.d_model, config.d_ff, activation=config.activation)
    return TransformerLayer(
        attention,
        feed_forward,
        d_model=config.d_model,
        norm=config.norm,
        dropout=config.dropout,
        layer_norm_eps=config.layer_norm_eps,
    )


def build_encoder(config: ModelConfig, *, init: bool = True) -> Encoder:
    """The encoder described by ``config`` (BERT-initialised unless ``init=False``)."""
    slots = build_positions(
        config.position,
        d_model=config.d_model,
        n_heads=config.n_heads,
        max_len=config.max_len,
        qk_only=config.position_qk_only,
        max_distance=config.max_distance,
        num_buckets=config.num_buckets,
        rope_base=config.rope_base,
    )
    embeddings = Embeddings(
        config.vocab_size,
        config.d_model,
        type_vocab_size=config.type_vocab_size,
        positions=None if slots.qk_only else slots.input,
        pad_token_id=config.pad_token_id,
        layer_norm_eps=config.layer_norm_eps,
        dropout=config.dropout,
    )
    encoder = Encoder(
        embeddings,
        [build_layer(config, slots) for _ in range(config.n_layers)],
        max_len=config.max_len,
        final_norm=nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm == "pre" else None,
        qk_positions=slots.input if slots.qk_only else None,
    )
    encoder.config = config
    if init:
        init_weights(encoder, config.initializer_range)
    return encoder


def build_masked_lm(config: ModelConfig, *, init: bool = True, sparse_prediction: bool = True):
    """The masked-LM model (encoder + head tied to the word embeddings) described by ``config``."""
    from qkv.models.mlm import MaskedLM, MaskedLMHead

    encoder = build_encoder(config, init=False)
    head = MaskedLMHead(
        config.d_model,
        config.vocab_size,
        activation=config.activation,
        layer_norm_eps=config.layer_norm_eps,
    )
    model = MaskedLM(encoder, head, sparse_prediction=sparse_prediction)
    model.config = config
    if init:
        init_weights(model, config.initializer_range)
    return model


def build_model(config: ModelConfig, *, masked_lm: bool, init: bool = True):
    """:func:`build_masked_lm` when ``masked_lm`` else :func:`build_encoder`."""
    return build_masked_lm(config, init=init) if masked_lm else build_encoder(config, init=init)


def init_weights(model: nn.Module, std: float) -> None:
    """BERT initialisation of every linear, embedding and LayerNorm in ``model`` (in place).

    A learned input (or query/key) position table ``weight`` is drawn like BERT's position
    embeddings. Other parameters (similarity temperatures, bilinear maps, position modules'
    own tables that are not ``nn.Embedding``) keep the initialisation their modules give them.
    """
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, (Embeddings, Encoder)):
            table = getattr(module.positions if isinstance(module, Embeddings) else module.qk_positions,
                            "weight", None)
            if isinstance(table, nn.Parameter):  # a learned position table
                nn.init.normal_(table, std=std)
