"""Builders of the image models: a :class:`~qkv.config.ModelConfig` with an ``image`` section →
:class:`~qkv.nn.vision_encoder.VisionEncoder`, :class:`~qkv.models.vision.ImageClassifier`,
:class:`~qkv.models.vision.ImageCaptioner`.

The layers are the text models' (:func:`qkv.models.builders.build_layer`: every similarity, norm,
feed-forward and backend); what differs is the input — patches (:mod:`qkv.nn.patches`) and their
positions on the grid (``image.position``, built with the grid so that the 2-D schemes can place
each patch). Initialisation is BERT's (:func:`~qkv.models.builders.init_weights`), the [CLS] vector
and a learned position table drawn like the other weights.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from qkv.config import ModelConfig
from qkv.models.builders import build_attention, build_layer, build_norm_for, init_weights
from qkv.models.heads import TaskConfig
from qkv.models.parts import check_parts
from qkv.models.seq2seq import Decoder
from qkv.models.vision import ImageCaptioner, ImageClassifier
from qkv.nn.decoder_layer import DecoderLayer
from qkv.nn.embeddings import Embeddings
from qkv.nn.maps import TRAINING, LinearMaps
from qkv.nn.patches import ImageEmbeddings, PatchEmbedding
from qkv.nn.pooler import Pooler
from qkv.nn.positional import build_positions
from qkv.nn.vision_encoder import VisionEncoder

__all__ = ["build_vision_encoder", "build_image_classifier", "build_image_captioner", "image_slots"]


def _image(config: ModelConfig):
    if not isinstance(config, ModelConfig) or config.image is None:
        raise ValueError("an image model needs a ModelConfig with an image section (ModelConfig.image: size, "
                         "channels, patch, …); e.g. ModelConfig.preset('vit-tiny')")
    return config.image


def image_slots(config: ModelConfig):
    """The position slots of the patches (``config.image.position`` over the grid)."""
    image = _image(config)
    p = config.positions
    return build_positions(image.position, d_model=config.d_model, n_heads=config.attention.n_heads,
                           max_len=image.n_tokens, qk_only=p.qk_only, max_distance=p.max_distance,
                           num_buckets=p.num_buckets, rope_base=p.rope_base, grid=image.grid, prefix=image.prefix)


def build_vision_encoder(config: ModelConfig, *, init: bool = True, maps: LinearMaps = TRAINING) -> VisionEncoder:
    """The Vision Transformer encoder ``config`` describes (its ``image`` section: the input).

    The final norm is there for pre-LN stacks (ViT's); ``config.pooler`` adds ViT's pooler.
    ``norm.embeddings`` does not apply (ViT adds no norm before the first layer).
    """
    check_parts(config)
    image = _image(config)
    if config.layer_types is not None and "local" in config.layer_types:
        raise ValueError("sliding-window (local) layers read a 1-D neighbourhood; an image model's layers must be "
                         "global (layer_types=None)")
    slots = image_slots(config)
    patches = PatchEmbedding(image.size, image.channels, image.patch, image.strides, config.d_model,
                             stem=image.stem, maps=maps)
    embeddings = ImageEmbeddings(patches, config.d_model, cls_token=image.cls_token,
                                 positions=None if slots.qk_only else slots.input, dropout=config.dropout)
    encoder = VisionEncoder(
        embeddings,
        [build_layer(config, slots, index=i, maps=maps) for i in range(config.n_layers)],
        final_norm=build_norm_for(config) if config.norm.placement == "pre" else None,
        qk_positions=slots.input if slots.qk_only else None,
        pooler=Pooler(config.d_model, maps=maps) if config.pooler else None,
        config=config,
    )
    if init:
        _init(encoder, config.initializer_range)
    return encoder


def _init(model: nn.Module, std: float) -> None:
    """BERT's initialisation, the [CLS] vectors and learned position tables included."""
    init_weights(model, std)
    for module in model.modules():
        if isinstance(module, (ImageEmbeddings, VisionEncoder)):
            table = module.positions if isinstance(module, ImageEmbeddings) else module.qk_positions
            if isinstance(getattr(table, "weight", None), nn.Parameter):
                nn.init.normal_(table.weight, std=std)
            if isinstance(module, ImageEmbeddings) and module.cls is not None:
                nn.init.normal_(module.cls, std=std)


def build_image_classifier(config: ModelConfig, task: TaskConfig, *, init: bool = True,
                           maps: LinearMaps = TRAINING) -> ImageClassifier:
    """An :class:`ImageClassifier` for ``task`` (``sequence-classification``: labels, pooling) on the
    encoder ``config`` describes; pooling ``pooler`` builds the encoder with its pooler."""
    if task.pooling == "pooler" and not config.pooler:
        config = config.replace(pooler=True)
    encoder = build_vision_encoder(config, init=False, maps=maps)
    model = ImageClassifier(encoder, task, maps.linear(config.d_model, task.num_labels), config=config)
    if init:
        _init(model, config.initializer_range)
    if encoder.pooler is not None and task.pooling != "pooler":
        encoder.pooler.requires_grad_(False)  # kept to round-trip, not trained (DDP needs every grad used)
    return model


def build_image_captioner(config: ModelConfig, *, init: bool = True, decoder_start_token_id: int = 1,
                          maps: LinearMaps = TRAINING) -> ImageCaptioner:
    """An :class:`ImageCaptioner`: the vision encoder ``config`` describes and a text decoder of the
    same width and depth (``n_layers`` each), ``vocab_size`` tokens, captions of up to ``max_len``
    tokens, positions ``positions.scheme`` (the text side's). Cross-attention has no positions."""
    if config.pooler:
        raise ValueError("pooler=True: a captioner's decoder reads every patch; build it without a pooler")
    encoder = build_vision_encoder(config, init=False, maps=maps)
    p = config.positions
    slots = build_positions(p.scheme, d_model=config.d_model, n_heads=config.attention.n_heads, max_len=config.max_len,
                            qk_only=p.qk_only, max_distance=p.max_distance, num_buckets=p.num_buckets,
                            rope_base=p.rope_base, offset=p.offset)
    embeddings = Embeddings(config.vocab_size, config.d_model, type_vocab_size=0,
                            positions=None if slots.qk_only else slots.input, pad_token_id=config.pad_token_id,
                            norm=build_norm_for(config) if config.norm.embeddings else nn.Identity(),
                            dropout=config.dropout,
                            token_scale=math.sqrt(config.d_model) if config.embed_scale else 1.0)
    C, H, a = config.d_model, config.attention.n_heads, config.attention
    layers = []
    for i in range(config.n_layers):
        base = build_layer(config, slots, index=i, maps=maps)  # causal self-attention, feed-forward, their norms
        cross = build_attention(C, H, similarity=a.similarity, similarity_kwargs=dict(a.similarity_kwargs),
                                out_proj=a.out_proj, bias=a.bias, dropout=a.dropout, backend=a.backend,
                                chunk_size=a.chunk_size, n_kv_heads=a.n_kv_heads, qk_norm=a.qk_norm,
                                qk_norm_scale=a.qk_norm_scale, qk_norm_eps=config.norm.eps, context_width=C, maps=maps)
        layers.append(DecoderLayer(base.attention, cross, base.feed_forward, norm1=base.norm1,
                                   norm2=build_norm_for(config), norm3=base.norm2, norm=config.norm.placement,
                                   dropout=config.dropout))
    decoder = Decoder(embeddings, layers, max_len=config.max_len,
                      final_norm=build_norm_for(config) if config.norm.placement == "pre" else None,
                      qk_positions=slots.input if slots.qk_only else None)
    model = ImageCaptioner(encoder, decoder, decoder_start_token_id=decoder_start_token_id,
                           pad_token_id=0 if config.pad_token_id is None else config.pad_token_id, config=config)
    if init:
        _init(model, config.initializer_range)
        with torch.no_grad():
            for table in (getattr(decoder.qk_positions, "weight", None),):
                if isinstance(table, nn.Parameter):
                    nn.init.normal_(table, std=config.initializer_range)
    return model
