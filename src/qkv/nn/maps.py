"""How a model's linear maps are made: trainable, or for inference in a precision (:class:`LinearMaps`).

Legend: I input width, O output width.

The builders (:mod:`qkv.models.builders`) make every linear map of a model through one
:class:`LinearMaps` value, so a model prepared for inference is built, not rewritten: its maps are
:class:`~qkv.nn.linear.InferenceLinear` (float32 or bfloat16, oneDNN, the activation of a
feed-forward block fused into its first map) or :class:`~qkv.nn.linear.Int8Linear` from the start,
and ``load_state_dict`` fills them from a float model's weights. Each map has a kind: ``"qkv"`` (an
attention's query/key/value maps), ``"out"`` (its output map), ``"ffn_in"`` and ``"ffn_out"`` (the
feed-forward block's first and second maps), ``None`` (everything else: heads, pooler, embedding
projection). int8 mode quantises the kinds in ``int8_kinds``; the others run float32.

A tied output head (a masked LM's or a causal LM's ``logits = h · Eᵀ``, E the token embedding
table) multiplies by the table itself while training and in float32. In bf16 and int8 it gets a map
of its own, :meth:`LinearMaps.vocab_proj` (``C → V``, a bfloat16 copy of E or E quantised to int8
with one scale per row), because the embedding lookup stays float32: the copy costs ``V·C`` bytes in
bf16 (half the float32 table), ``V·C / 4`` in int8. The map is filled from the table when the model
loads its state (:func:`tie_to_table`) and left out of ``state_dict``: a prepared model saves what a
float model holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from qkv.nn.linear import FUSED_ACTIVATIONS, InferenceLinear, Int8Linear

__all__ = ["LinearMaps", "PRECISIONS", "LINEAR_KINDS", "INT8_KINDS", "TRAINING", "VOCAB_PROJ", "linear_shape",
           "tie_to_table"]

#: The inference precisions.
PRECISIONS = ("fp32", "bf16", "int8")
#: The kinds of linear map inside a transformer layer.
LINEAR_KINDS = ("qkv", "out", "ffn_in", "ffn_out")
#: The kinds int8 mode quantises, chosen by measurement (all-MiniLM-L6-v2, smoothing α = 0.7, worst
#: cosine to float32 on 26 short texts / 200 20 Newsgroups posts: qkv + out 0.9991 / 0.9993, + ffn_in
#: 0.9986 / 0.9986, + ffn_out 0.991 / 0.989; see docs/inference.md): the second feed-forward map,
#: whose input is the activation (heavy-tailed per token, not per channel), stays float32.
INT8_KINDS = ("qkv", "out", "ffn_in")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32}
#: The attribute name of a tied head's own output map (see :meth:`LinearMaps.vocab_proj`).
VOCAB_PROJ = "vocab_proj"


@dataclass(frozen=True)
class LinearMaps:
    """Makes a model's linear maps (see the module docstring).

    Attributes:
        precision: ``None`` (trainable ``nn.Linear``), ``"fp32"``, ``"bf16"`` or ``"int8"``.
        int8_kinds: with ``"int8"``, the kinds quantised (a subset of :data:`LINEAR_KINDS`).
    """

    precision: str | None = None
    int8_kinds: tuple[str, ...] = INT8_KINDS

    def __post_init__(self) -> None:
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} is not allowed; allowed: None (training), "
                             f"{', '.join(PRECISIONS)}")
        bad = [k for k in self.int8_kinds if k not in LINEAR_KINDS]
        if bad:
            raise ValueError(f"int8_kinds {bad} unknown; allowed: {', '.join(LINEAR_KINDS)}")

    @property
    def training(self) -> bool:
        """Trainable maps (``nn.Linear``)."""
        return self.precision is None

    def fuses(self, activation: str | None) -> bool:
        """Whether a first feed-forward map made here applies ``activation`` itself."""
        return not self.training and activation in FUSED_ACTIVATIONS

    def linear(self, in_features: int, out_features: int, bias: bool = True, *, kind: str | None = None,
               activation: str | None = None) -> nn.Module:
        """A map ``(…,I) → (…,O)`` of this precision; ``activation`` (when :meth:`fuses` says so) is
        applied inside it. Its weights are filled by ``load_state_dict`` (or initialised, when trainable)."""
        if self.training:
            return nn.Linear(in_features, out_features, bias=bias)
        act = activation if self.fuses(activation) else None
        if self.precision == "int8" and kind in self.int8_kinds:
            return Int8Linear(in_features, out_features, bias, activation=act)
        return InferenceLinear(in_features, out_features, bias, dtype=_DTYPES[self.precision], activation=act)

    def vocab_proj(self, d_model: int, vocab_size: int) -> nn.Module | None:
        """The output map ``(…,C) → (…,V)`` of a head tied to the token table, without bias: ``None``
        where the head multiplies by the table itself (training, ``"fp32"``), a bfloat16
        :class:`~qkv.nn.linear.InferenceLinear` (``"bf16"``) or an :class:`~qkv.nn.linear.Int8Linear`
        (``"int8"``, whatever ``int8_kinds``: per-row weight scales, dynamic input quantisation)."""
        if self.precision == "bf16":
            return InferenceLinear(d_model, vocab_size, bias=False, dtype=torch.bfloat16)
        if self.precision == "int8":
            return Int8Linear(d_model, vocab_size, bias=False)
        return None


#: The maps of a model being trained.
TRAINING = LinearMaps()


def tie_to_table(model: nn.Module, table: str, proj: str) -> None:
    """Tie the output map at ``proj`` (a module path in ``model``, e.g. ``"head.vocab_proj"``) to the
    token table at ``table`` (a state key, e.g. ``"encoder.embeddings.tokens.weight"``): loading a state
    without ``proj``'s weight fills it from the table's entry (cast or quantised by the map), and
    ``state_dict`` leaves ``proj``'s entries out. Called once, by the model's constructor."""

    def fill(_module, state, prefix, *_):
        key = prefix + proj + ".weight"
        if key not in state and prefix + table in state:
            state[key] = state[prefix + table]

    def drop(_module, state, prefix, _metadata):
        for key in [k for k in state if k.startswith(prefix + proj + ".")]:
            del state[key]

    model.register_load_state_dict_pre_hook(fill)
    model.register_state_dict_post_hook(drop)


def linear_shape(module) -> tuple[int, int] | None:
    """``(out_features, in_features)`` of a linear map this module can make (``nn.Linear``,
    :class:`~qkv.nn.linear.InferenceLinear`, :class:`~qkv.nn.linear.Int8Linear`), else ``None``."""
    if isinstance(module, (nn.Linear, InferenceLinear, Int8Linear)):
        return module.out_features, module.in_features
    return None
