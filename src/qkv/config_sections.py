"""The sections of a :class:`~qkv.config.ModelConfig`, each a frozen dataclass validated once:
:class:`AttentionConfig` (``attention``), :class:`PositionConfig` (``positions``),
:class:`FeedForwardConfig` (``ffn``), :class:`NormConfig` (``norm``) and :class:`DecoderConfig`
(``decoder``: an encoder–decoder's decoder where it differs from the encoder).

Plain values only; a bad value raises ``ValueError`` naming the field as ``section.name``. This
module imports nothing of qkv's models, modules or plugins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qkv.validation import check_bool, check_choice, check_int, check_positive, check_range

__all__ = ["AttentionConfig", "PositionConfig", "FeedForwardConfig", "NormConfig", "DecoderConfig",
           "NORM_PLACEMENTS"]

#: Where the norm sits: after each residual sum (BERT, the textbook) or before each sublayer.
NORM_PLACEMENTS = ("post", "pre")


@dataclass(frozen=True)
class AttentionConfig:
    """The attention of every layer.

    Attributes:
        n_heads: heads H (must divide ``d_model``).
        n_kv_heads: key/value heads for grouped-query attention (1 = multi-query); ``None`` = H.
        similarity: the score function's name (:mod:`qkv.nn.similarity`, or a plugin's).
        similarity_kwargs: extra keyword arguments for the similarity (e.g. ``temperature``).
        qkv_proj: learn the Q/K/V maps (``False``: attend on the inputs themselves).
        out_proj: learn the output map after the heads are merged.
        shared_qk: one learned map for queries and keys (keys = queries; needs ``qkv_proj`` and no
            grouped keys/values).
        bias: biases in the attention maps.
        dropout: dropout on the attention weights. Keep 0 (the default): any other value forces
            the quadratic math path instead of the fused kernel while training.
        backend: ``"auto"`` (chosen per kind of call) or a registered backend (``"sdpa"``,
            ``"explicit"``, ``"chunked"``, ``"offset_flash"``, ``"inplace"``, yours;
            :mod:`qkv.nn.backends`). Format 1 called it ``attention_path``.
        chunk_size: queries per block on the chunked backend (``None``: sized automatically).
        qk_norm: normalise each head's queries and keys before the similarity: ``"none"``,
            ``"layernorm"`` or ``"rmsnorm"`` (over the head width D).
        qk_norm_scale: the qk-norm has a learned per-dimension scale.
        window: the sliding window of ``"local"`` layers (``layer_types``): a query attends to the
            keys within ``window // 2`` positions either side (ModernBERT's ``local_attention``).
    """

    n_heads: int = 12
    n_kv_heads: int | None = None
    similarity: str = "scaled_dot"
    similarity_kwargs: dict[str, Any] = field(default_factory=dict)
    qkv_proj: bool = True
    out_proj: bool = True
    shared_qk: bool = False
    bias: bool = True
    dropout: float = 0.0
    backend: str = "auto"
    chunk_size: int | None = None
    qk_norm: str = "none"
    qk_norm_scale: bool = True
    window: int | None = None

    def __post_init__(self) -> None:
        check_int("attention.n_heads", self.n_heads)
        for name in ("n_kv_heads", "chunk_size", "window"):
            check_int(f"attention.{name}", getattr(self, name), optional=True)
        for name in ("qkv_proj", "out_proj", "shared_qk", "bias", "qk_norm_scale"):
            check_bool(f"attention.{name}", getattr(self, name))
        for name in ("similarity", "backend", "qk_norm"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"attention.{name}={getattr(self, name)!r} must be a name (a non-empty string)")
        check_range("attention.dropout", self.dropout, 0, 1, number=True)
        if not isinstance(self.similarity_kwargs, dict):
            raise ValueError(f"attention.similarity_kwargs must be a dict, got {self.similarity_kwargs!r}")
        if self.shared_qk and (not self.qkv_proj or self.n_kv_heads not in (None, self.n_heads)):
            raise ValueError(f"attention.shared_qk=True needs qkv_proj=True and n_kv_heads=None (got qkv_proj="
                             f"{self.qkv_proj}, n_kv_heads={self.n_kv_heads}): the keys are the queries' own map")


@dataclass(frozen=True)
class PositionConfig:
    """Where positions enter (:mod:`qkv.nn.positional`: added to the input, a q/k transform, a score bias).

    Attributes:
        scheme: the position scheme's name (``learned``, ``sinusoidal``, ``rope``, ``relative``,
            ``t5``, ``alibi``, ``relative-alibi``, ``none``, or a plugin's).
        qk_only: add input positions to the query and key maps only, not the values.
        max_distance: largest relative distance distinguished (relative, T5 buckets).
        num_buckets: number of T5 relative-position buckets.
        rope_base: base of the rotary frequencies.
        local_rope_base: rotary base of local layers (ModernBERT: 10000 local, 160000 global);
            ``None`` = ``rope_base``.
        offset: first row of the learned position table used (RoBERTa: pad id + 1 = 2); the table
            has ``max_len + offset`` rows.
    """

    scheme: str = "learned"
    qk_only: bool = False
    max_distance: int = 128
    num_buckets: int = 32
    rope_base: float = 10000.0
    local_rope_base: float | None = None
    offset: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.scheme, str) or not self.scheme:
            raise ValueError(f"positions.scheme={self.scheme!r} must be a name (a non-empty string)")
        check_bool("positions.qk_only", self.qk_only)
        check_int("positions.max_distance", self.max_distance)
        check_int("positions.num_buckets", self.num_buckets)
        check_int("positions.offset", self.offset, low=0)
        check_positive("positions.rope_base", self.rope_base)
        check_positive("positions.local_rope_base", self.local_rope_base, optional=True)


@dataclass(frozen=True)
class FeedForwardConfig:
    """The position-wise feed-forward network of every layer.

    Attributes:
        d_ff: hidden width F.
        activation: the non-linearity's name (``gelu``, ``gelu_tanh``, ``relu``, ``silu``).
        kind: ``"mlp"`` (``W₂ act(W₁x)``) or ``"glu"`` (gated: ``W₂ (act(W x) ⊙ V x)``; GeGLU with
            ``gelu``, SwiGLU with ``silu``).
        bias: biases in the feed-forward maps.
    """

    d_ff: int = 3072
    activation: str = "gelu"
    kind: str = "mlp"
    bias: bool = True

    def __post_init__(self) -> None:
        check_int("ffn.d_ff", self.d_ff)
        check_bool("ffn.bias", self.bias)
        for name in ("activation", "kind"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"ffn.{name}={getattr(self, name)!r} must be a name (a non-empty string)")


@dataclass(frozen=True)
class NormConfig:
    """The norms: their placement and kind.

    Attributes:
        placement: ``"post"`` (BERT, the textbook) or ``"pre"``.
        kind: the norm's name (``"layernorm"``, ``"rmsnorm"``, or a plugin's).
        eps: the norms' epsilon (BERT: 1e-12).
        bias: biases (β) in the norms.
        first_attention: pre-LN only: ``False`` = the first layer's attention takes the (already
            normalised) embeddings without its own norm (ModernBERT).
        embeddings: normalise the sum of the embeddings (BERT); ``False`` = no norm there (GPT-2).
    """

    placement: str = "post"
    kind: str = "layernorm"
    eps: float = 1e-12
    bias: bool = True
    first_attention: bool = True
    embeddings: bool = True

    def __post_init__(self) -> None:
        check_choice("norm.placement", self.placement, NORM_PLACEMENTS)
        if not isinstance(self.kind, str) or not self.kind:
            raise ValueError(f"norm.kind={self.kind!r} must be a name (a non-empty string)")
        check_positive("norm.eps", self.eps)
        for name in ("bias", "first_attention", "embeddings"):
            check_bool(f"norm.{name}", getattr(self, name))
        if not self.first_attention and self.placement != "pre":
            raise ValueError(f"norm.first_attention=False needs norm.placement='pre' (got {self.placement!r}): a "
                             "post-LN layer must normalise its residual sum; set placement='pre' or "
                             "first_attention=True")


@dataclass(frozen=True)
class DecoderConfig:
    """The decoder of an encoder–decoder (:func:`qkv.models.builders.build_encoder_decoder`) where it
    differs from the encoder; ``ModelConfig.decoder=None`` elsewhere (and in encoder–decoders saved
    before this section existed, which build as they did).

    Attributes:
        vocab_size: the target vocabulary when it is not the source's: the decoder then has a token
            table of its own (separate vocabularies, Marian's ``decoder_vocab_size``); ``None`` = one
            table shared with the encoder.
        n_layers: decoder layers; ``None`` = ``ModelConfig.n_layers``.
        start_token_id: the decoder's first input (BOS; Marian and T5 start from the pad id).
        eos_token_id: the token that ends a target (generation stops there), or ``None``.
        logits_bias: a fixed ``(V,)`` bias added to the logits (Marian's and BART's ``final_logits_bias``).
        output_scale: the decoder's output is multiplied by it before the tied head (T5: ``d_model**-0.5``).
        causal_buckets: with ``t5`` positions, the decoder's self-attention buckets count past offsets
            only (T5's decoder); ``False``: the encoder's two-sided buckets, half of them masked.
    """

    vocab_size: int | None = None
    n_layers: int | None = None
    start_token_id: int = 1
    eos_token_id: int | None = None
    logits_bias: bool = False
    output_scale: float = 1.0
    causal_buckets: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layers"):
            check_int(f"decoder.{name}", getattr(self, name), optional=True)
        check_int("decoder.start_token_id", self.start_token_id, low=0)
        check_int("decoder.eos_token_id", self.eos_token_id, low=0, optional=True)
        for name in ("logits_bias", "causal_buckets"):
            check_bool(f"decoder.{name}", getattr(self, name))
        check_positive("decoder.output_scale", self.output_scale)
