"""Frozen, nested, serialisable model configurations: :class:`ModelConfig`, its parts, presets, JSON.

A configuration holds only plain values. Sizes and the embeddings sit at the top; the attention,
positions, feed-forward and norm fields each in their own sub-configuration
(:mod:`qkv.config_sections`: ``AttentionConfig``, ``PositionConfig``, ``FeedForwardConfig``,
``NormConfig``, and an encoder–decoder's ``DecoderConfig``); ``layer_types`` says which layers attend globally and which in a sliding
window. Every field is checked once, in ``__post_init__``; a bad value raises ``ValueError`` naming
the field, the value and what is allowed.

Names of parts (a similarity, an attention backend, a position scheme, a norm, an activation) are
plain strings here: the builders (:mod:`qkv.models.builders`) resolve them to parts and refuse the
unknown ones. This module imports nothing of qkv's models, modules or plugins.

Format 1 (flat, 45 fields) is read through :func:`qkv.config_migrate.nest`: :meth:`ModelConfig.from_dict`
accepts it, and :meth:`ModelConfig.preset` / :meth:`ModelConfig.from_flat` take the flat names
(``n_heads``, ``position``, ``attention_path`` …) as short forms of the nested fields.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qkv.config_image import ImageConfig
from qkv.config_migrate import FLAT, SECTIONS, layer_types_for, nest
from qkv.config_sections import AttentionConfig, DecoderConfig, FeedForwardConfig, NormConfig, PositionConfig
from qkv.validation import check_bool, check_choice, check_heads, check_int, check_positive, check_range

__all__ = ["ModelConfig", "PRESETS", "LAYER_TYPES", "flat_value", "field_path", "layer_period"]

#: What a layer's attention sees: every key, or a sliding window of ``attention.window`` keys.
LAYER_TYPES = ("global", "local")
_BERT_VOCAB = 30522

#: Named sizes, in the flat short names (:meth:`ModelConfig.preset`). ``tiny`` uses small *distinct*
#: sizes so that a swapped axis fails a test.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=97, d_model=24, n_heads=3, d_ff=40, n_layers=2, max_len=19, type_vocab_size=4),
    # chosen by measurement for masked-LM pretraining in minutes on a 2-core CPU (docs/pretraining.md)
    "cpu-small": dict(vocab_size=8192, d_model=128, n_heads=4, d_ff=512, n_layers=2, max_len=512,
                      norm="pre", dropout=0.0, position="relative-alibi"),
    # the same shape as a causal LM (qkv pretrain --objective clm; docs/decoder.md): no segment embeddings
    "cpu-small-clm": dict(vocab_size=8192, d_model=128, n_heads=4, d_ff=512, n_layers=2, max_len=512,
                          norm="pre", dropout=0.0, position="relative-alibi", type_vocab_size=0),
    "mini": dict(vocab_size=_BERT_VOCAB, d_model=256, n_heads=4, d_ff=1024, n_layers=4, max_len=512),
    "small": dict(vocab_size=_BERT_VOCAB, d_model=512, n_heads=8, d_ff=2048, n_layers=6, max_len=512),
    "base": dict(vocab_size=_BERT_VOCAB, d_model=768, n_heads=12, d_ff=3072, n_layers=12, max_len=512),
    # shaped like answerdotai/ModernBERT-base (transformers' ModernBertConfig defaults); every third
    # layer global (``global_every``: the layer types follow n_layers when it is overridden)
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


_SUBCONFIGS = {"attention": AttentionConfig, "positions": PositionConfig, "ffn": FeedForwardConfig,
               "norm": NormConfig}
#: Sections that may be ``None`` (a model that has no such part).
_OPTIONAL = {"decoder": DecoderConfig}


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to build a model (defaults: BERT-base).

    Attributes:
        vocab_size: token vocabulary V.
        d_model: model width C.
        n_layers: number of transformer layers.
        max_len: longest sequence accepted (size of a learned position table).
        type_vocab_size: number of segment (token type) ids; 0 = no segment embeddings.
        dropout: dropout on embeddings and on each sublayer output before the residual sum.
        pad_token_id: id of the padding token (its embedding row starts at zero, gets no grad);
            ``None`` = no padding row (GPT-2, whose every row is a real token).
        initializer_range: standard deviation of the normal weight initialisation.
        embed_scale: multiply the token embeddings by √C before positions are added.
        embedding_size: token embedding width E when it differs from C (ELECTRA): the embeddings
            are projected E → C before the layers; ``None`` = C.
        pooler: give the encoder BERT's pooler (``tanh(dense(h[:, 0]))``, its ``pooler_output``).
        head_bias: a bias in the masked-LM head's dense transform (BERT: yes; ModernBERT: no).
        family: the Hugging Face family the model was imported from and is exported to again
            (``"bert"``, ``"roberta"``, ``"distilbert"``, ``"electra"``, ``"modernbert"``, ``"gpt2"``);
            ``None`` = a qkv model, exported as BERT. It builds nothing.
        attention: :class:`AttentionConfig`. positions: :class:`PositionConfig`.
        ffn: :class:`FeedForwardConfig`. norm: :class:`NormConfig`.
        layer_types: each layer's attention, ``"global"`` or ``"local"`` (a sliding window of
            ``attention.window``), as Hugging Face's ``layer_types``; ``None`` = every layer global.
        decoder: :class:`DecoderConfig` of an encoder–decoder, or ``None``.
        image: an image model's input and patch embedding (:class:`~qkv.config_image.ImageConfig`);
            ``None`` = a text model. Its encoder reads patches, not tokens: ``vocab_size`` and
            ``max_len`` then describe a captioner's text decoder (1 and the patch count for a
            classifier), and ``positions.scheme`` is the text side's (the patches': ``image.position``).
    """

    vocab_size: int = _BERT_VOCAB
    d_model: int = 768
    n_layers: int = 12
    max_len: int = 512
    type_vocab_size: int = 2
    dropout: float = 0.1
    pad_token_id: int | None = 0
    initializer_range: float = 0.02
    embed_scale: bool = False
    embedding_size: int | None = None
    pooler: bool = False
    head_bias: bool = True
    family: str | None = None
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    positions: PositionConfig = field(default_factory=PositionConfig)
    ffn: FeedForwardConfig = field(default_factory=FeedForwardConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    layer_types: tuple[str, ...] | None = None
    decoder: DecoderConfig | None = None
    image: ImageConfig | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "max_len"):
            check_int(name, getattr(self, name))
        check_int("type_vocab_size", self.type_vocab_size, low=0)
        check_int("pad_token_id", self.pad_token_id, low=0, optional=True)
        check_int("embedding_size", self.embedding_size, optional=True)
        if self.pad_token_id is not None and self.pad_token_id >= self.vocab_size:
            raise ValueError(f"pad_token_id={self.pad_token_id} must be < vocab_size={self.vocab_size}")
        check_range("dropout", self.dropout, 0, 1, number=True)
        check_positive("initializer_range", self.initializer_range)
        for name in ("embed_scale", "pooler", "head_bias"):
            check_bool(name, getattr(self, name))
        if self.family is not None and not isinstance(self.family, str):
            raise ValueError(f"family={self.family!r} must be a family name or None")
        for name, cls in _SUBCONFIGS.items():
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}")
        if isinstance(self.decoder, dict):
            object.__setattr__(self, "decoder", _section("decoder", self.decoder))
        if self.decoder is not None and not isinstance(self.decoder, DecoderConfig):
            raise ValueError(f"decoder must be a DecoderConfig or None, got {type(self.decoder).__name__}")
        for name in ("start_token_id", "eos_token_id"):
            value = None if self.decoder is None else getattr(self.decoder, name)
            limit = self.vocab_size if self.decoder is None or self.decoder.vocab_size is None else self.decoder.vocab_size
            if value is not None and value >= limit:
                raise ValueError(f"decoder.{name}={value} must be < the target vocabulary size {limit}")
        check_heads(self.d_model, self.attention.n_heads, self.attention.n_kv_heads, prefix="attention.")
        if self.image is not None and not isinstance(self.image, ImageConfig):
            raise ValueError(f"image must be an ImageConfig or None, got {type(self.image).__name__}")
        self._check_layer_types()

    def _check_layer_types(self) -> None:
        types = self.layer_types
        if types is None:
            return
        if isinstance(types, list):
            object.__setattr__(self, "layer_types", types := tuple(types))
        if not isinstance(types, tuple) or len(types) != self.n_layers:
            raise ValueError(f"layer_types must list one type per layer ({self.n_layers}), got {types!r}")
        for t in types:
            check_choice("layer_types entry", t, LAYER_TYPES)
        if "local" in types and self.attention.window is None:
            raise ValueError("layer_types has local layers but attention.window is None; set the window "
                             "(e.g. attention.window=128) or make every layer global")

    @property
    def d_head(self) -> int:
        """Width of one attention head, ``d_model // attention.n_heads``."""
        return self.d_model // self.attention.n_heads

    def is_local(self, index: int) -> bool:
        """Whether layer ``index`` attends in a sliding window (``layer_types``)."""
        return self.layer_types is not None and self.layer_types[index] == "local"

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """The preset ``name`` (``tiny``, ``cpu-small``, ``cpu-small-clm``, ``mini``, ``small``, ``base``,
        ``modernbert``, ``gpt2``: a causal LM's shape) with fields overridden: top-level fields,
        sections as dicts (``attention={"n_heads": 8}``) or flat short names (``n_heads=8``,
        ``position="rope"``; :data:`qkv.config_migrate.FLAT`)."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; allowed: {', '.join(PRESETS)}")
        return cls.from_dict(_merge(nest(PRESETS[name]), nest(overrides)))

    @classmethod
    def from_flat(cls, **fields: Any) -> ModelConfig:
        """A config from top-level fields and flat short names (format 1's), e.g.
        ``ModelConfig.from_flat(d_model=24, n_heads=3, d_ff=40, position="rope")``."""
        return cls.from_dict(fields)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes`` applied (top-level fields, sections as dicts, or flat short names),
        validated again."""
        return type(self).from_dict(_merge(self.to_dict(), nest(changes)))

    def to_dict(self) -> dict[str, Any]:
        """Plain nested ``dict`` of every field (JSON-serialisable)."""
        out = dataclasses.asdict(self)
        out["attention"]["similarity_kwargs"] = dict(self.attention.similarity_kwargs)
        out["layer_types"] = None if self.layer_types is None else list(self.layer_types)
        out["image"] = None if self.image is None else self.image.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Build from a ``dict``: nested (format 2) or flat (format 1, migrated); unknown keys are an
        error naming them and the allowed ones."""
        if not isinstance(data, dict):
            raise ValueError(f"a model config must be a JSON object, got {type(data).__name__}")
        data = nest(data)
        every = data.pop("global_every", None)
        window = (data.get("attention") or {}).get("window") if isinstance(data.get("attention"), dict) else None
        if every is not None and window is not None and data.get("layer_types") is None:
            data["layer_types"] = layer_types_for(int(data.get("n_layers", 12)), int(every))
        top = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(top))
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s) {unknown}; allowed: {', '.join(top)} and the flat "
                             f"names {', '.join(sorted(FLAT))}")
        kwargs = dict(data)
        for section in (*SECTIONS, *_OPTIONAL):
            value = kwargs.get(section)
            if isinstance(value, dict):
                kwargs[section] = _section(section, value)
        if isinstance(kwargs.get("layer_types"), list):
            kwargs["layer_types"] = tuple(kwargs["layer_types"])
        if isinstance(kwargs.get("image"), dict):
            kwargs["image"] = ImageConfig.from_dict(kwargs["image"])
        return cls(**kwargs)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | Path) -> ModelConfig:
        """Parse JSON text, or read it from a path."""
        if isinstance(text, Path):
            text = text.read_text(encoding="utf-8")
        return cls.from_dict(json.loads(text))


def _section(name: str, values: dict[str, Any]):
    cls = {**_SUBCONFIGS, **_OPTIONAL}[name]
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {name} field(s) {unknown}; allowed: {', '.join(allowed)}")
    return cls(**values)


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` applied, sections merged field by field; the layer types follow a
    changed ``n_layers`` when the base's came from format 1's ``global_every`` pattern, and a window
    set to ``None`` makes every layer global."""
    out = dict(base)
    for key, value in changes.items():
        if key in _OPTIONAL and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        elif key in (*SECTIONS, "image") and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        elif key in SECTIONS and isinstance(value, dict) and out.get(key) is not None:
            out[key] = {**dataclasses.asdict(out[key]), **value}
        elif key == "image" and isinstance(value, dict) and isinstance(out.get(key), ImageConfig):
            out[key] = {**out[key].to_dict(), **value}
        else:
            out[key] = value
    window_off = isinstance(changes.get("attention"), dict) and "window" in changes["attention"] \
        and changes["attention"]["window"] is None
    if window_off and "layer_types" not in changes:
        out["layer_types"] = None  # no window: every layer global (format 1's local_window=None)
    types = out.get("layer_types")
    n = out.get("n_layers")
    if types and "layer_types" not in changes and n is not None and len(types) != n:
        every = _period(tuple(types))
        if every is not None:
            out["layer_types"] = layer_types_for(n, every)
    return out


def _period(types: tuple[str, ...]) -> int | None:
    """k when ``types`` is format 1's pattern (layer i global iff i % k == 0), else ``None``."""
    for k in range(1, len(types) + 1):
        if types == layer_types_for(len(types), k):
            return k
    return None


def layer_period(config: ModelConfig) -> int | None:
    """k when layer i of ``config`` is global exactly when ``i % k == 0`` (1: every layer global; the
    ``global_attn_every_n_layers`` of Hugging Face's ModernBERT), else ``None``."""
    if config.layer_types is None or "local" not in config.layer_types:
        return 1
    return _period(config.layer_types)


def field_path(name: str) -> str:
    """Where a flat short name lives (``"n_kv_heads"`` → ``"attention.n_kv_heads"``; ``"norm"`` →
    ``"norm.placement"``); a top-level field's name as it is."""
    if name == "norm":
        return "norm.placement"
    if name in FLAT:
        section, field_name = FLAT[name]
        return f"{section}.{field_name}"
    return name


def flat_value(config: ModelConfig, name: str) -> Any:
    """The value of ``config`` at a flat short name or a dotted path (``"position"``, ``"attention.backend"``)."""
    value: Any = config
    for part in field_path(name).split("."):
        value = getattr(value, part)
    return value
