"""Builders: the only code that reads a :class:`~qkv.config.ModelConfig` and makes modules.

``build_encoder(config)``, ``build_masked_lm(config)``, ``build_causal_lm(config)``,
``build_discriminator(config)`` and ``build_encoder_decoder(config)``
assemble plain-argument modules from :mod:`qkv.nn` and :mod:`qkv.models` and initialise them as
BERT does (normal(0, ``initializer_range``) for linear and embedding weights, zero biases, unit
norm scales γ and zero β, a zero padding row). The task models (a classifier or regressor on an
encoder, for fine-tuning) are built in :mod:`qkv.models.task_builders`.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from qkv.config import ModelConfig
from qkv.config_sections import DecoderConfig
from qkv.models.parts import check_parts
from qkv.nn.attend import BackendPlan
from qkv.nn.attention import MultiHeadAttention
from qkv.nn.embeddings import Embeddings
from qkv.nn.encoder import Encoder
from qkv.nn.feed_forward import FEED_FORWARDS
from qkv.nn.layer import TransformerLayer
from qkv.nn.maps import TRAINING, LinearMaps
from qkv.nn.norms import RMSNorm, build_norm
from qkv.nn.pooler import Pooler
from qkv.nn.qk_norm import build_qk_norm
from qkv.nn.positional import T5RelativeBias, build_positions
from qkv.nn.similarity import build_similarity
from qkv.validation import check_heads
from qkv.models.discriminator import Discriminator, DiscriminatorHead
from qkv.models.mlm import MaskedLM, MaskedLMHead
from qkv.models.causal_lm import CausalLM
from qkv.models.seq2seq import Decoder, EncoderDecoder, SharedTokenEmbeddings
from qkv.nn.decoder_layer import DecoderLayer

__all__ = ["build_attention", "build_layer", "build_norm_for", "build_encoder",
           "build_masked_lm", "build_causal_lm", "build_model", "build_discriminator",
           "init_weights", "build_encoder_decoder"]


def build_attention(d_model: int, n_heads: int, *, similarity: str = "scaled_dot",
                    similarity_kwargs: dict | None = None, qkv_proj: bool = True, out_proj: bool = True,
                    bias: bool = True, dropout: float = 0.0, qk_transform: nn.Module | None = None,
                    score_bias: nn.Module | None = None, backend: str = "auto",
                    chunk_size: int | None = None, n_kv_heads: int | None = None, qk_norm: str = "none",
                    qk_norm_scale: bool = True, qk_norm_eps: float = 1e-6,
                    window: int | None = None, shared_qk: bool = False,
                    context_width: int | None = None, maps: LinearMaps = TRAINING) -> MultiHeadAttention:
    """A :class:`~qkv.nn.attention.MultiHeadAttention` from plain options: its parts are made here,
    and its backend resolved (:class:`~qkv.nn.attend.BackendPlan`).

    Args:
        d_model: model width C. n_heads: heads H (must divide C).
        similarity: a name registered in :data:`qkv.nn.similarity.SIMILARITIES`.
        similarity_kwargs: extra keyword arguments for the similarity (e.g. ``temperature``).
        qkv_proj: learn Q/K/V maps (one fused ``C → C + 2·G·D`` linear, G key/value heads);
            ``False`` attends on the embeddings themselves.
        out_proj: apply the output map to the concatenated heads.
        bias: biases in the linear maps.
        dropout: dropout on the attention weights.
        qk_transform: position transform of q and k (rotary), or ``None``.
        score_bias: additive score bias module (relative, T5, ALiBi), or ``None``.
        backend: ``"auto"`` or a registered attention backend.
        chunk_size: queries per block on the chunked backend.
        n_kv_heads: key/value heads G (grouped-query attention; 1 = multi-query), ``None`` = H.
        qk_norm: ``"none"``, ``"layernorm"`` or ``"rmsnorm"`` of each head's q and k over D.
        qk_norm_scale: the qk-norm learns a per-dimension scale. qk_norm_eps: its ε.
        window: sliding-window width W (keys within ``W // 2`` either side), ``None`` = global.
        shared_qk: one map for queries and keys (``C → 2C``: queries = keys, values).
        context_width: cross-attention over a context of width E: a ``C → C`` query map and an
            ``E → 2·G·D`` key/value map (no positions, window or shared map then); ``None`` = self-attention.
        maps: how the linear maps are made (:class:`~qkv.nn.maps.LinearMaps`: trainable by default,
            or for inference in a precision).
    """
    check_heads(d_model, n_heads)
    d_head = d_model // n_heads
    kv_width = (n_heads if n_kv_heads is None else n_kv_heads) * d_head  # G·D
    cross = context_width is not None
    if cross and not qkv_proj:
        raise ValueError("cross-attention needs its maps (qkv_proj=True): keys and values come from another "
                         "sequence of another width")
    return MultiHeadAttention(
        d_model,
        n_heads,
        similarity=build_similarity(similarity, n_heads=n_heads, d_head=d_head, **(similarity_kwargs or {})),
        qkv_proj=maps.linear(d_model, (2 * d_model if shared_qk else d_model + 2 * kv_width), bias, kind="qkv")
        if qkv_proj and not cross else None,
        q_proj=maps.linear(d_model, d_model, bias, kind="qkv") if cross else None,
        kv_proj=maps.linear(context_width, 2 * kv_width, bias, kind="qkv") if cross else None,
        out_proj=maps.linear(d_model, d_model, bias, kind="out") if out_proj else None,
        n_kv_heads=n_kv_heads,
        shared_qk=shared_qk,
        qk_norm=build_qk_norm(qk_norm, d_head, scale=qk_norm_scale, eps=qk_norm_eps),
        qk_transform=qk_transform,
        score_bias=score_bias,
        window=window,
        dropout=dropout,
        backend=BackendPlan(backend),
        chunk_size=chunk_size,
    )


def build_norm_for(config: ModelConfig, width: int | None = None) -> nn.Module:
    """A fresh ``config.norm.kind`` norm over C, or ``width`` (``layer_norm_eps``, β when
    ``norm_bias``): every norm of the model (embeddings — E wide with ``embedding_size`` —, layers,
    final norm, masked-LM head) is one of these."""
    return build_norm(config.norm.kind, width or config.d_model, eps=config.norm.eps,
                      bias=config.norm.bias)


def build_layer(config: ModelConfig, slots, *, index: int = 0, maps: LinearMaps = TRAINING) -> TransformerLayer:
    """Layer ``index`` of the stack; position slots give each layer its own q/k transform and bias.

    A local layer (``config.layer_types``) attends within ``config.attention.window`` and rotates
    with ``config.positions.local_rope_base`` (``None``: ``rope_base``); a global one sees every key.
    The feed-forward is ``config.ffn.kind`` (``mlp`` or gated ``glu``) with ``mlp_bias``. With
    ``first_attention_norm=False`` (pre-LN) layer 0's attention takes its input unnormalised
    (``norm1`` is ``nn.Identity()``): the embeddings are normalised already.
    """
    local = config.is_local(index)
    attention = build_attention(
        config.d_model,
        config.attention.n_heads,
        similarity=config.attention.similarity,
        similarity_kwargs=dict(config.attention.similarity_kwargs),
        qkv_proj=config.attention.qkv_proj,
        out_proj=config.attention.out_proj,
        shared_qk=config.attention.shared_qk,
        bias=config.attention.bias,
        dropout=config.attention.dropout,
        qk_transform=slots.make_qk_transform(rope_base=config.positions.local_rope_base if local else None),
        score_bias=slots.make_score_bias(),
        backend=config.attention.backend,
        chunk_size=config.attention.chunk_size,
        n_kv_heads=config.attention.n_kv_heads,
        qk_norm=config.attention.qk_norm,
        qk_norm_scale=config.attention.qk_norm_scale,
        qk_norm_eps=config.norm.eps,
        window=config.attention.window if local else None,
        maps=maps,
    )
    feed_forward = FEED_FORWARDS[config.ffn.kind](config.d_model, config.ffn.d_ff, activation=config.ffn.activation,
                                                  bias=config.ffn.bias, maps=maps)
    skip_norm1 = index == 0 and not config.norm.first_attention
    return TransformerLayer(
        attention,
        feed_forward,
        norm1=nn.Identity() if skip_norm1 else build_norm_for(config),
        norm2=build_norm_for(config),
        norm=config.norm.placement,
        dropout=config.dropout,
    )


def build_encoder(config: ModelConfig, *, init: bool = True, causal: bool = False,
                  maps: LinearMaps = TRAINING) -> Encoder:
    """The encoder described by ``config`` (BERT-initialised unless ``init=False``); with
    ``causal`` every layer's attention is causal (the stack of a decoder). ``maps``: how its linear
    maps are made (trainable, or for inference in a precision: :func:`qkv.inference.for_inference`).

    With ``config.embedding_size`` E ≠ C the embeddings (their positions and LayerNorm too) are E
    wide and a ``Linear(E, C)`` follows them (ELECTRA); ``config.positions.offset`` shifts the
    learned position rows used (RoBERTa).
    """
    check_parts(config)
    width = config.embedding_size or config.d_model
    if width != config.d_model and config.positions.qk_only:
        raise ValueError(f"embedding_size={width} (≠ d_model={config.d_model}) cannot be combined with "
                         "positions.qk_only=True: the positions would be E wide but q and k are C wide")
    kw = dict(max_len=config.max_len, qk_only=config.positions.qk_only, max_distance=config.positions.max_distance,
              num_buckets=config.positions.num_buckets, rope_base=config.positions.rope_base, offset=config.positions.offset)
    slots = build_positions(config.positions.scheme, d_model=config.d_model, n_heads=config.attention.n_heads, **kw)
    inputs = slots.input
    if width != config.d_model:  # the input encoding is E wide (heads play no part in it)
        inputs = build_positions(config.positions.scheme, d_model=width, n_heads=1, **kw).input
    embeddings = Embeddings(
        config.vocab_size,
        width,
        type_vocab_size=config.type_vocab_size,
        positions=None if slots.qk_only else inputs,
        pad_token_id=config.pad_token_id,
        norm=build_norm_for(config, width) if config.norm.embeddings else nn.Identity(),
        dropout=config.dropout,
        token_scale=math.sqrt(config.d_model) if config.embed_scale else 1.0,
    )
    encoder = Encoder(
        embeddings,
        [build_layer(config, slots, index=i, maps=maps) for i in range(config.n_layers)],
        max_len=config.max_len,
        final_norm=build_norm_for(config) if config.norm.placement == "pre" else None,
        qk_positions=slots.input if slots.qk_only else None,
        pooler=Pooler(config.d_model, maps=maps) if config.pooler else None,
        embed_proj=maps.linear(width, config.d_model) if width != config.d_model else None,
        causal=causal,
        config=config,
    )
    if init:
        init_weights(encoder, config.initializer_range)
    return encoder


def build_discriminator(config: ModelConfig, *, init: bool = True, maps: LinearMaps = TRAINING):
    """The replaced-token discriminator (encoder + ELECTRA's per-token head) described by
    ``config``; see :class:`qkv.models.discriminator.Discriminator`."""
    encoder = build_encoder(config, init=False, maps=maps)
    head = DiscriminatorHead(config.d_model, activation=config.ffn.activation, maps=maps)
    model = Discriminator(encoder, head, config=config)
    if init:
        init_weights(model, config.initializer_range)
    if encoder.pooler is not None:
        encoder.pooler.requires_grad_(False)
    return model


def build_masked_lm(config: ModelConfig, *, init: bool = True, sparse_prediction: bool = True,
                    maps: LinearMaps = TRAINING):
    """The masked-LM model (encoder + head tied to the word embeddings) described by ``config``.

    With ``config.pooler`` the encoder carries BERT's pooler so that it round-trips (import,
    export, a task head later), frozen (``requires_grad=False``): the masked-LM loss does not use
    it, and a parameter without gradient would stall distributed (DDP) training.
    """
    if config.embedding_size not in (None, config.d_model):
        raise ValueError(f"embedding_size={config.embedding_size} (≠ d_model={config.d_model}): the "
                         "masked-LM head ties its decoder to C-wide token embeddings; build an encoder or "
                         "a discriminator")
    encoder = build_encoder(config, init=False, maps=maps)
    head = MaskedLMHead(
        config.d_model,
        config.vocab_size,
        norm=build_norm_for(config),
        activation=config.ffn.activation,
        dense_bias=config.head_bias,
        maps=maps,
    )
    model = MaskedLM(encoder, head, sparse_prediction=sparse_prediction, config=config)
    if init:
        init_weights(model, config.initializer_range)
    if encoder.pooler is not None:
        encoder.pooler.requires_grad_(False)
    return model


def build_causal_lm(config: ModelConfig, *, init: bool = True, maps: LinearMaps = TRAINING):
    """The causal language model (a causal stack + the LM head tied to the word embeddings, GPT-2's)
    described by ``config``; see :class:`qkv.models.causal_lm.CausalLM`.

    Every similarity, position scheme, norm, feed-forward and backend works causally. Refused: a
    pooler (it reads the first token, which sees only itself in a causal stack) and an
    ``embedding_size`` other than C (the head is tied to C-wide token embeddings).
    """
    if config.pooler:
        raise ValueError("pooler=True: BERT's pooler reads the first token, which a causal model lets see only "
                         "itself; build the causal LM without a pooler")
    if config.embedding_size not in (None, config.d_model):
        raise ValueError(f"embedding_size={config.embedding_size} (≠ d_model={config.d_model}): the LM head "
                         "ties its output map to C-wide token embeddings")
    model = CausalLM(build_encoder(config, init=False, causal=True, maps=maps),
                     vocab_proj=maps.vocab_proj(config.d_model, config.vocab_size), config=config)
    if init:
        init_weights(model, config.initializer_range)
    return model


def build_model(config: ModelConfig, *, masked_lm: bool, init: bool = True, maps: LinearMaps = TRAINING):
    """:func:`build_masked_lm` when ``masked_lm`` else :func:`build_encoder`."""
    if masked_lm:
        return build_masked_lm(config, init=init, maps=maps)
    return build_encoder(config, init=init, maps=maps)


def init_weights(model: nn.Module, std: float) -> None:
    """BERT initialisation of every linear, embedding and norm in ``model`` (in place): normal(0,
    ``std``) weights, zero biases (where there are any), a zero padding row, norm scales γ = 1 and
    LayerNorm shifts β = 0 (a LayerNorm without β, an RMSNorm without γ: what there is).

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
        elif isinstance(module, (nn.LayerNorm, RMSNorm)):
            if module.weight is not None:  # None: no learned scale (e.g. a qk-norm without one)
                nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (Embeddings, Encoder)):
            table = getattr(module.positions if isinstance(module, Embeddings) else module.qk_positions,
                            "weight", None)
            if isinstance(table, nn.Parameter):  # a learned position table
                nn.init.normal_(table, std=std)


def build_encoder_decoder(config: ModelConfig, *, init: bool = True, decoder_start_token_id: int | None = None,
                          maps: LinearMaps = TRAINING):
    """The encoder–decoder (:class:`qkv.models.seq2seq.EncoderDecoder`) described by ``config``:
    encoder and decoder of the same width, heads and feed-forward; the decoder's vocabulary, depth,
    start and end tokens, output scale and logits bias from ``config.decoder``
    (:class:`~qkv.config_sections.DecoderConfig`; ``None``: one vocabulary — the decoder reads the encoder's
    token table —, ``n_layers`` each, start token 1). The LM head is tied to the decoder's table.

    Every position scheme works: relative ones (relative, T5, ALiBi, RoPE) act in the decoder's
    causal self-attention (T5's buckets one-directional there unless ``decoder.causal_buckets`` is
    off); absolute ones index the decoder's own positions from 0 (a table of its own). Cross-attention
    has no positions. Refused: a pooler and ``embedding_size`` ≠ C. ``decoder_start_token_id``
    overrides ``config.decoder.start_token_id``.
    """
    if config.pooler:
        raise ValueError("pooler=True: an encoder-decoder has no use for BERT's pooler; build it without one")
    if config.embedding_size not in (None, config.d_model):
        raise ValueError(f"embedding_size={config.embedding_size} (≠ d_model={config.d_model}): the LM head "
                         "ties its output map to C-wide token embeddings")
    dec = config.decoder or DecoderConfig(causal_buckets=False)  # no section: as built before it existed
    encoder = build_encoder(config, init=False, maps=maps)
    slots = _decoder_slots(config, dec)
    kw = dict(positions=None if slots.qk_only else slots.input, type_vocab_size=0,
              norm=build_norm_for(config) if config.norm.embeddings else nn.Identity(), dropout=config.dropout,
              token_scale=math.sqrt(config.d_model) if config.embed_scale else 1.0)
    if dec.vocab_size is None:  # one vocabulary: the encoder's table
        embeddings = SharedTokenEmbeddings(encoder.embeddings.tokens, config.d_model, **kw)
    else:  # separate vocabularies: a table of the decoder's own
        embeddings = Embeddings(dec.vocab_size, config.d_model, pad_token_id=config.pad_token_id, **kw)
    layers = [_decoder_layer(config, slots, i, maps) for i in range(dec.n_layers or config.n_layers)]
    decoder = Decoder(embeddings, layers, max_len=config.max_len,
                      final_norm=build_norm_for(config) if config.norm.placement == "pre" else None,
                      qk_positions=slots.input if slots.qk_only else None)
    start = dec.start_token_id if decoder_start_token_id is None else decoder_start_token_id
    model = EncoderDecoder(encoder, decoder, decoder_start_token_id=start,
                           pad_token_id=0 if config.pad_token_id is None else config.pad_token_id,
                           eos_token_id=dec.eos_token_id, output_scale=dec.output_scale,
                           logits_bias=dec.logits_bias, config=config)
    if init:
        init_weights(model, config.initializer_range)
        table = getattr(decoder.qk_positions, "weight", None)
        if isinstance(table, nn.Parameter):  # a learned query/key position table of the decoder
            nn.init.normal_(table, std=config.initializer_range)
    return model


def _decoder_slots(config: ModelConfig, dec: DecoderConfig):
    """The decoder's position slots: the encoder's scheme, T5's buckets one-directional (``causal_buckets``)."""
    p = config.positions
    slots = build_positions(p.scheme, d_model=config.d_model, n_heads=config.attention.n_heads, max_len=config.max_len,
                            qk_only=p.qk_only, max_distance=p.max_distance, num_buckets=p.num_buckets,
                            rope_base=p.rope_base, offset=p.offset)
    if p.scheme == "t5" and dec.causal_buckets:
        slots.score_bias_factory = functools.partial(T5RelativeBias, config.attention.n_heads, p.num_buckets,
                                                     p.max_distance, bidirectional=False)
    return slots


def _decoder_layer(config: ModelConfig, slots, index: int, maps: LinearMaps) -> DecoderLayer:
    """Decoder layer ``index``: the causal self-attention, feed-forward and norms of a stack layer,
    and a cross-attention over the encoder's C-wide output."""
    a = config.attention
    base = build_layer(config, slots, index=index, maps=maps)
    cross = build_attention(config.d_model, a.n_heads, similarity=a.similarity, similarity_kwargs=dict(a.similarity_kwargs),
                            out_proj=a.out_proj, bias=a.bias, dropout=a.dropout, backend=a.backend,
                            chunk_size=a.chunk_size, n_kv_heads=a.n_kv_heads, qk_norm=a.qk_norm,
                            qk_norm_scale=a.qk_norm_scale, qk_norm_eps=config.norm.eps, context_width=config.d_model,
                            maps=maps)
    return DecoderLayer(base.attention, cross, base.feed_forward, norm1=base.norm1, norm2=build_norm_for(config),
                        norm3=base.norm2, norm=config.norm.placement, dropout=config.dropout)
