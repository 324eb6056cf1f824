"""Frozen, serialisable configurations: :class:`ModelConfig`, its presets and JSON round-trip.

A config holds only plain values (ints, floats, strings, bools, a dict of similarity keyword
arguments). Modules never read it: the builders in :mod:`qkv.models.builders` do. Every field is
checked in ``__post_init__``; a bad value raises ``ValueError`` naming the field, the value and
what is allowed. A name of a registered part (similarity, attention path, position scheme, norm)
not registered loads the installed plugins first (:mod:`qkv.plugins`), and the message says how to
load one.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qkv.validation import check_bool, check_choice, check_int, check_positive, check_range

__all__ = ["ModelConfig", "PRESETS", "NORMS"]

#: Where the LayerNorm sits: after each residual sum (BERT, the textbook) or before each sublayer.
NORMS = ("post", "pre")
_BERT_VOCAB = 30522

#: Named sizes. ``tiny`` uses small *distinct* sizes so that a swapped axis fails a test.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=97, d_model=24, n_heads=3, d_ff=40, n_layers=2, max_len=19,
                 type_vocab_size=4),
    # chosen by measurement for masked-LM pretraining in minutes on a 2-core CPU (docs/pretraining.md)
    "cpu-small": dict(vocab_size=8192, d_model=128, n_heads=4, d_ff=512, n_layers=2, max_len=512,
                      norm="pre", dropout=0.0, position="relative-alibi"),
    # the same shape as a causal LM (qkv pretrain --objective clm; docs/decoder.md): no segment embeddings
    "cpu-small-clm": dict(vocab_size=8192, d_model=128, n_heads=4, d_ff=512, n_layers=2, max_len=512,
                          norm="pre", dropout=0.0, position="relative-alibi", type_vocab_size=0),
    "mini": dict(vocab_size=_BERT_VOCAB, d_model=256, n_heads=4, d_ff=1024, n_layers=4, max_len=512),
    "small": dict(vocab_size=_BERT_VOCAB, d_model=512, n_heads=8, d_ff=2048, n_layers=6, max_len=512),
    "base": dict(vocab_size=_BERT_VOCAB, d_model=768, n_heads=12, d_ff=3072, n_layers=12, max_len=512),
    # shaped like answerdotai/ModernBERT-base (transformers' ModernBertConfig defaults)
    "modernbert": dict(vocab_size=50368, d_model=768, n_heads=12, d_ff=1152, n_layers=22, max_len=8192,
                       type_vocab_size=0, norm="pre", dropout=0.0, layer_norm_eps=1e-5,
                       pad_token_id=50283, position="rope", rope_base=160000.0, local_rope_base=10000.0,
                       local_window=128, global_every=3, feed_forward="glu", activation="gelu",
                       attention_bias=False, norm_bias=False, mlp_bias=False, head_bias=False,
                       first_attention_norm=False, family="modernbert"),
    # shaped like GPT-2 small, 124M (transformers' GPT2Config defaults): a causal LM (build_causal_lm)
    "gpt2": dict(vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_layers=12, max_len=1024,
                 type_vocab_size=0, norm="pre", activation="gelu_tanh", dropout=0.1,
                 layer_norm_eps=1e-5, pad_token_id=None, embedding_norm=False, family="gpt2"),
}


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to build an encoder or a masked-LM model (defaults: BERT-base).

    Attributes:
        vocab_size: token vocabulary V.
        d_model: model width C.
        n_heads: attention heads H (must divide ``d_model``).
        d_ff: hidden width of the feed-forward network.
        n_layers: number of transformer layers.
        max_len: longest sequence accepted (size of a learned position table).
        type_vocab_size: number of segment (token type) ids; 0 = no segment embeddings.
        activation: feed-forward non-linearity, one of :data:`qkv.nn.layer.ACTIVATIONS`.
        norm: ``"post"`` (BERT) or ``"pre"`` LayerNorm placement.
        dropout: dropout on embeddings and on each sublayer output before the residual sum.
        attention_dropout: dropout on attention weights. Keep 0 (the default): any other value
            forces the quadratic math path instead of the fused kernel while training.
        similarity: score function name (see :data:`qkv.nn.similarity.SIMILARITIES`; a plugin's
            too, docs/plugins.md).
        similarity_kwargs: extra keyword arguments for the similarity (e.g. ``temperature``).
        qkv_proj: learn the Q/K/V maps (``False``: attend on the inputs themselves).
        out_proj: learn the output map after the heads are merged.
        shared_qk: one learned map for queries and keys (keys = queries; the score matrix of a head
            is symmetric); needs ``qkv_proj`` and no grouped keys/values.
        attention_bias: biases in the attention maps.
        attention_path: the attention backend: ``"auto"`` (chosen per call), or a registered one
            (``"sdpa"``, ``"explicit"``, ``"chunked"``, ``"offset_flash"``, ``"inplace"``, yours;
            see :mod:`qkv.nn.backends`).
        chunk_size: queries per block on the chunked backend (``None``: sized automatically).
        position: position scheme, one of :data:`qkv.nn.positional.POSITION_SCHEMES` (the built-in
            :data:`~qkv.nn.positional.POSITIONS` or a plugin's).
        position_qk_only: add input positions to the query and key maps only, not the values.
        max_distance: largest relative distance distinguished (relative, T5 buckets).
        num_buckets: number of T5 relative-position buckets.
        rope_base: base of the rotary frequencies.
        layer_norm_eps: LayerNorm epsilon (BERT: 1e-12).
        pad_token_id: id of the padding token (its embedding row starts at zero, gets no grad);
            ``None`` = no padding row (GPT-2, whose every row is a real token).
        initializer_range: standard deviation of the normal weight initialisation.
        n_kv_heads: key/value heads for grouped-query attention (GQA; 1 = multi-query, MQA);
            ``None`` = ``n_heads`` (plain multi-head). Must divide ``n_heads``.
        qk_norm: normalise each head's queries and keys before the similarity: ``"none"``,
            ``"layernorm"`` or ``"rmsnorm"`` (over the head width D).
        qk_norm_scale: the qk-norm has a learned per-dimension scale.
        local_window: sliding-window (local) attention: a query attends to the keys within
            ``local_window // 2`` positions either side (ModernBERT's ``local_attention``);
            ``None`` = every layer global.
        global_every: with ``local_window``, layer i is global when ``i % global_every == 0``
            (ModernBERT: 3), the others local.
        local_rope_base: rotary base on local layers (ModernBERT: 10000 local, 160000 global);
            ``None`` = ``rope_base``.
        norm_type: the normalisation layer, one of :data:`qkv.nn.norms.NORM_TYPES`
            (``"layernorm"``, ``"rmsnorm"``).
        norm_bias: biases (β) in the LayerNorms.
        mlp_bias: biases in the feed-forward maps.
        feed_forward: ``"mlp"`` (``W₂ act(W₁x)``) or ``"glu"`` (gated: ``W₂ (act(W x) ⊙ V x)``;
            GeGLU with ``activation="gelu"``, SwiGLU with ``"silu"``).
        embed_scale: multiply the token embeddings by √C before positions are added.
        embedding_size: token embedding width E when it differs from C (ELECTRA): the embeddings
            are projected E → C before the layers; ``None`` = C.
        position_offset: first row of the learned position table used (RoBERTa: pad id + 1 = 2);
            the table has ``max_len + position_offset`` rows.
        first_attention_norm: pre-LN only: ``False`` = the first layer's attention takes the
            (already normalised) embeddings without its own norm (ModernBERT).
        embedding_norm: normalise the sum of the embeddings (BERT); ``False`` = no norm there
            (GPT-2: token + position embeddings go straight into the first pre-LN layer).
        head_bias: a bias in the masked-LM head's dense transform (BERT: yes; ModernBERT's
            ``classifier_bias``: no). The decoder's per-token bias is always there.
        pooler: give the encoder BERT's pooler (``tanh(dense(h[:, 0]))``, its ``pooler_output``).
            Set on import when a Hugging Face checkpoint has one (so that it is kept and exported
            again), and by the task-model builders for sequence tasks that pool with it.
        family: the Hugging Face model family the model was imported from and is exported to
            again (``"bert"``, ``"roberta"``, ``"distilbert"``, ``"electra"``, ``"modernbert"``,
            ``"gpt2"``: the keys of :data:`qkv.models.families.FAMILIES`); ``None`` = a qkv model,
            exported as BERT.
            Set on import and by the ``modernbert`` and ``gpt2`` presets; it builds nothing.
    """

    vocab_size: int = _BERT_VOCAB
    d_model: int = 768
    n_heads: int = 12
    d_ff: int = 3072
    n_layers: int = 12
    max_len: int = 512
    type_vocab_size: int = 2
    activation: str = "gelu"
    norm: str = "post"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    similarity: str = "scaled_dot"
    similarity_kwargs: dict[str, Any] = field(default_factory=dict)
    qkv_proj: bool = True
    out_proj: bool = True
    shared_qk: bool = False
    attention_bias: bool = True
    attention_path: str = "auto"
    chunk_size: int | None = None
    position: str = "learned"
    position_qk_only: bool = False
    max_distance: int = 128
    num_buckets: int = 32
    rope_base: float = 10000.0
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    initializer_range: float = 0.02
    pooler: bool = False
    n_kv_heads: int | None = None
    qk_norm: str = "none"
    qk_norm_scale: bool = True
    local_window: int | None = None
    global_every: int = 1
    local_rope_base: float | None = None
    norm_type: str = "layernorm"
    norm_bias: bool = True
    mlp_bias: bool = True
    feed_forward: str = "mlp"
    embed_scale: bool = False
    embedding_size: int | None = None
    position_offset: int = 0
    first_attention_norm: bool = True
    head_bias: bool = True
    embedding_norm: bool = True
    family: str | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len",
                     "max_distance", "num_buckets"):
            check_int(name, getattr(self, name), low=1)
        check_int("type_vocab_size", self.type_vocab_size, low=0)
        check_int("pad_token_id", self.pad_token_id, low=0, optional=True)
        check_int("chunk_size", self.chunk_size, low=1, optional=True)
        for name in ("n_kv_heads", "local_window", "embedding_size"):
            check_int(name, getattr(self, name), low=1, optional=True)
        check_int("global_every", self.global_every, low=1)
        check_int("position_offset", self.position_offset, low=0)
        if self.pad_token_id is not None and self.pad_token_id >= self.vocab_size:
            raise ValueError(f"pad_token_id={self.pad_token_id} must be < vocab_size={self.vocab_size}")
        if self.d_model % self.n_heads:
            divisors = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0]
            raise ValueError(
                f"n_heads={self.n_heads} does not divide d_model={self.d_model}; allowed: {divisors}"
            )
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            divisors = [h for h in range(1, self.n_heads + 1) if self.n_heads % h == 0]
            raise ValueError(f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}; "
                             f"allowed: {divisors} (1 = multi-query attention)")
        from qkv.nn.layer import ACTIVATIONS, FEED_FORWARDS
        from qkv.nn.qk_norm import QK_NORM_TYPES

        for name, allowed in (("activation", tuple(ACTIVATIONS)), ("norm", NORMS), ("qk_norm", QK_NORM_TYPES),
                              ("feed_forward", tuple(FEED_FORWARDS))):
            check_choice(name, getattr(self, name), allowed)
        _check_registered(self)
        if self.family is not None:
            from qkv.models.families import FAMILIES

            check_choice("family", self.family, tuple(FAMILIES))
        for name in ("dropout", "attention_dropout"):
            check_range(name, getattr(self, name), 0, 1, number=True)
        for name in ("rope_base", "layer_norm_eps", "initializer_range"):
            check_positive(name, getattr(self, name))
        if self.local_rope_base is not None:
            check_positive("local_rope_base", self.local_rope_base)
        for name in ("qkv_proj", "out_proj", "shared_qk", "attention_bias", "position_qk_only", "pooler", "qk_norm_scale",
                     "norm_bias", "mlp_bias", "embed_scale", "first_attention_norm", "head_bias", "embedding_norm"):
            check_bool(name, getattr(self, name))
        if self.shared_qk and (not self.qkv_proj or self.n_kv_heads not in (None, self.n_heads)):
            raise ValueError(f"shared_qk=True needs qkv_proj=True and n_kv_heads=None (got qkv_proj={self.qkv_proj}, "
                             f"n_kv_heads={self.n_kv_heads}): the keys are the queries' own map")
        if not self.first_attention_norm and self.norm != "pre":
            raise ValueError(f"first_attention_norm=False needs norm='pre' (got norm={self.norm!r}): a "
                             "post-LN layer must normalise its residual sum; set norm='pre' or "
                             "first_attention_norm=True")
        if not isinstance(self.similarity_kwargs, dict):
            raise ValueError(f"similarity_kwargs must be a dict, got {self.similarity_kwargs!r}")
        from qkv.nn.positional import POSITION_SCHEMES

        if self.position_qk_only and POSITION_SCHEMES[self.position].slot != "input":
            absolute = [n for n, s in POSITION_SCHEMES.items() if s.slot == "input"]
            raise ValueError(
                f"position_qk_only=True needs an input encoding; position={self.position!r} is not "
                f"one; allowed with it: {', '.join(absolute)}"
            )

    @property
    def d_head(self) -> int:
        """Width of one attention head, ``d_model // n_heads``."""
        return self.d_model // self.n_heads

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """The preset ``name`` (``tiny``, ``cpu-small``, ``cpu-small-clm``, ``mini``, ``small``, ``base``,
        ``modernbert``, ``gpt2``: a causal LM's shape) with fields overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; allowed: {', '.join(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides})

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain ``dict`` of every field (JSON-serialisable)."""
        out = dataclasses.asdict(self)
        out["similarity_kwargs"] = dict(self.similarity_kwargs)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Build from a ``dict``; unknown keys are an error naming them and the allowed ones."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s) {unknown}; allowed: {', '.join(names)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | Path) -> ModelConfig:
        """Parse JSON text, or read it from a path."""
        if isinstance(text, Path):
            text = text.read_text(encoding="utf-8")
        return cls.from_dict(json.loads(text))


def _registries() -> dict[str, tuple[str, Any]]:
    """Field → (kind, names) of the fields that name a registered part (built-in or a plugin's)."""
    from qkv.nn.backends import backend_names
    from qkv.nn.norms import NORM_TYPES
    from qkv.nn.positional import POSITION_SCHEMES
    from qkv.nn.similarity import SIMILARITIES

    return {"similarity": ("similarity", sorted(SIMILARITIES)),
            "attention_path": ("backend", backend_names()), "position": ("position", tuple(POSITION_SCHEMES)), "norm_type": ("norm", sorted(NORM_TYPES))}


def _check_registered(config: ModelConfig) -> None:
    """Each part ``config`` names is registered; on a miss, the installed plugins are loaded first
    (:func:`qkv.plugins.load_plugins`), and the message says how to load a plugin."""
    from qkv import plugins

    registries = _registries()
    if any(getattr(config, name) not in allowed for name, (_, allowed) in registries.items()):
        plugins.load_plugins()
        registries = _registries()
    for field_name, (kind, allowed) in registries.items():
        value = getattr(config, field_name)
        if value not in allowed:
            raise ValueError(f"{field_name}={value!r} is not allowed; allowed: "
                             f"{', '.join(map(str, allowed))}. A {kind} from a plugin: {plugins.how_to_load()}")
