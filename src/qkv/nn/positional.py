"""Position information in three slots, selected by name.

Legend: B batch, H heads, T query length, S key length, D head dim, C model width,
L = T+S-1 offsets.

Self-attention is permutation-equivariant; these modules tell it word order through one of:

* **added to the input** — ``sinusoidal`` (fixed, Vaswani et al. 2017; ``sinusoidal-halves``: the
  same values, sines before cosines, as Marian lays them out) or ``learned`` (a table of
  ``max_len`` rows): ``forward(T) -> (T, C)`` added to the token embeddings; or, with
  ``qk_only``, added only where queries and keys are computed, never to the values;
* **a transform of q and k** — ``rope`` (RoFormer, Su et al.): each head's q and k rotated by an
  angle proportional to their position, so that qᵀk depends on the offset only;
* **an additive score bias** of the offset ``d = j - i`` — ``relative`` (a learned scalar per
  head and clipped offset; ``relative-alibi``: the same table started at ALiBi's penalties), ``t5`` (T5's log-spaced buckets), ``alibi`` (a fixed linear penalty
  with geometric head slopes); these live in :mod:`qkv.nn.position_bias` (names re-exported here)
  and return an :class:`~qkv.nn.offset_bias.OffsetBias`, which :func:`~qkv.nn.attend.attend`
  runs on the fused kernel without an ``(H,T,S)`` tensor.

:func:`build_positions` turns a name into :class:`PositionSlots`; an encoder adds ``input`` to its
embeddings (or passes it to each layer as ``qk_pos``) and asks the slots for a new q/k transform
and score bias per layer. Each scheme, built-in or a plugin's, is one factory registered into one
slot with :func:`register_position`. See docs/positions.md for the formulas and when to use each.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from qkv import plugins
from qkv.nn.position_bias import (ALiBiBias, RelativePositionBias, T5RelativeBias, alibi_slopes, check_sizes,
                                  offsets, t5_buckets)
from qkv.nn.positional_2d import AxialRotary, SinCos2DPositions

__all__ = [
    "POSITIONS",
    "GRID_POSITIONS",
    "POSITION_SCHEMES",
    "SLOTS",
    "PositionScheme",
    "PositionSizes",
    "PositionSlots",
    "register_position",
    "build_positions",
    "SinusoidalPositions",
    "LearnedPositions",
    "RelativePositionBias",
    "T5RelativeBias",
    "ALiBiBias",
    "RotaryEmbedding",
    "sinusoid_table",
    "t5_buckets",
    "alibi_slopes",
    "offsets",
]



# ---------------------------------------------------------------- added to the input


def sinusoid_table(length: int, d_model: int, base: float = 10000.0, *, halves: bool = False) -> Tensor:
    """``(T, C)`` float64: ``PE[p, 2i] = sin(p / base^(2i/C))``, ``PE[p, 2i+1] = cos(p / base^(2i/C))``;
    ``halves``: the same sines in the first ⌈C/2⌉ columns and the cosines after them (Marian's layout)."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # (T,1)
    two_i = (torch.arange(d_model) // 2 * 2).to(torch.float64)  # (C,) 0,0,2,2,4,4,…
    angle = pos / base ** (two_i / d_model)  # (T,1)/(C,) -> (T,C)
    if halves:
        return torch.cat([angle[:, 0::2].sin(), angle[:, 1::2].cos()], dim=1)  # (T,⌈C/2⌉) | (T,⌊C/2⌋)
    return torch.where(torch.arange(d_model) % 2 == 0, angle.sin(), angle.cos())


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal encodings (Vaswani et al. 2017); any length (rows beyond the cache are
    computed on the fly). A buffer, not a parameter, and not saved in the state dict.

    Args:
        max_len: rows kept ready. d_model: C. base: the wavelength base (10000).
        halves: sines then cosines (Marian's layout, position ``sinusoidal-halves``), not interleaved.
    """

    def __init__(self, max_len: int, d_model: int, base: float = 10000.0, *, halves: bool = False):
        super().__init__()
        check_sizes(max_len=max_len, d_model=d_model)
        self.max_len, self.d_model, self.base, self.halves = max_len, d_model, base, halves
        self.register_buffer("table", self._table(max_len).float(), persistent=False)
        self._made_for = (self.table.dtype, self.table.device)

    def forward(self, length: int) -> Tensor:
        """``(T, C)`` encodings of positions ``0 … T-1`` in the module's dtype and device."""
        table = self.table
        if (table.dtype, table.device) != self._made_for:  # after .to(): recompute, never re-round
            self.table = table = self._table(self.max_len).to(table)
            self._made_for = (table.dtype, table.device)
        if length > table.shape[0]:
            return self._table(length).to(table)
        return table[:length]

    def _table(self, length: int) -> Tensor:
        return sinusoid_table(length, self.d_model, self.base, halves=self.halves)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, d_model={self.d_model}" + (", halves" if self.halves else "")


class LearnedPositions(nn.Module):
    """A trainable table, ``weight (max_len + offset, C)`` (BERT's position embeddings); a
    sequence of length T uses rows ``offset … offset+T-1`` (RoBERTa: ``offset = pad id + 1``, its
    first rows unused by real tokens).

    Raises ``ValueError`` for a sequence longer than ``max_len``.
    """

    def __init__(self, max_len: int, d_model: int, *, offset: int = 0):
        super().__init__()
        check_sizes(max_len=max_len, d_model=d_model)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ValueError(f"offset must be an integer >= 0, got {offset!r}")
        self.offset = offset
        self.weight = nn.Parameter(torch.empty(max_len + offset, d_model).normal_(std=0.02))

    def forward(self, length: int) -> Tensor:
        """``(T, C)`` rows ``offset … offset+T-1``."""
        max_len = self.weight.shape[0] - self.offset
        if length > max_len:
            raise ValueError(
                f"sequence length {length} exceeds the learned position table's max_len="
                f"{max_len}; raise max_len or use a relative encoding "
                "(relative, t5, alibi, rope), which accept any length"
            )
        return self.weight[self.offset:self.offset + length]


# ---------------------------------------------------------------- transform of q and k


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoFormer, Su et al. 2021) of each head's q and k.

    Dimension pairs ``(i, i + D/2)`` of a vector at position p turn by the angle
    ``p · base^(-2i/D)`` ("rotate-half" pairing; RoFormer's interleaved pairs up to a fixed
    permutation of the head dims). Norms are kept and ``rot(q, m)ᵀ rot(k, n)`` depends on
    ``m - n`` only. Queries are aligned with the last keys when ``S > T``.
    """

    def __init__(self, d_head: int, base: float = 10000.0):
        super().__init__()
        check_sizes(d_head=d_head)
        if d_head % 2:
            raise ValueError(f"rope needs an even head dim, got d_head={d_head}")
        if not base > 0:
            raise ValueError(f"rope base must be > 0, got {base}")
        self.d_head, self.base = d_head, base
        self._cache: tuple | None = None

    def _cos_sin(self, start: int, length: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """``(T,D)`` cosines and signed sines ``[-sin, sin]`` of the angles (float64, then cast)."""
        key = (start, length, like.dtype, like.device)
        if self._cache is None or self._cache[0] != key:
            half = self.d_head // 2
            inv_freq = self.base ** (-torch.arange(half, dtype=torch.float64) * 2 / self.d_head)  # (D/2,)
            angle = torch.arange(start, start + length, dtype=torch.float64)[:, None] * inv_freq  # (T,D/2)
            cos, sin = angle.cos(), angle.sin()
            self._cache = (key, torch.cat([cos, cos], -1).to(like), torch.cat([-sin, sin], -1).to(like))
        return self._cache[1], self._cache[2]

    def rotate(self, x: Tensor, start: int = 0) -> Tensor:
        """``x (…,T,D)`` at positions ``start … start+T-1``, rotated."""
        cos, signed_sin = self._cos_sin(start, x.shape[-2], x)  # (T,D) each
        half_turn = x.roll(self.d_head // 2, dims=-1)  # [x2, x1]
        return torch.addcmul(x * cos, half_turn, signed_sin)  # [x1 cos - x2 sin, x2 cos + x1 sin]

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """``q (B,H,T,D)``, ``k (B,H,S,D)`` → rotated ``(q, k)``."""
        if q.shape[-1] != self.d_head or k.shape[-1] != self.d_head:
            raise ValueError(f"rope was built for d_head={self.d_head}, got {q.shape[-1]} and {k.shape[-1]}")
        return self.rotate(q, k.shape[-2] - q.shape[-2]), self.rotate(k, 0)

    def extra_repr(self) -> str:
        return f"d_head={self.d_head}, base={self.base}"


# ---------------------------------------------------------------- slots and the builder


@dataclass
class PositionSlots:
    """What a position encoding contributes to an encoder.

    Attributes:
        input: module ``length -> (T, C)`` added to the token embeddings — or, when ``qk_only``,
            given to every layer's attention as ``qk_pos`` (added to the inputs of the query and
            key maps, not the values) — or ``None``.
        qk_only: see ``input``.
        qk_transform_factory: makes one q/k transform (``None``: no transform); called with
            ``rope_base=`` for a layer with its own rotary base.
        score_bias_factory: makes one score-bias module (``None``: no bias).
    """

    input: nn.Module | None
    qk_only: bool
    qk_transform_factory: Callable[[], nn.Module] | None = None
    score_bias_factory: Callable[[], nn.Module] | None = None

    def make_qk_transform(self, *, rope_base: float | None = None) -> nn.Module | None:
        """A new module ``(q, k) -> (q, k)`` on ``(B,H,T,D)`` tensors for one layer, or ``None``.

        Args:
            rope_base: this layer's own rotary base (e.g. the local layers' of a local/global
                encoder); ``None`` = the base the slots were built with. Ignored without a rotary
                transform.
        """
        if self.qk_transform_factory is None:
            return None
        if rope_base is None:
            return self.qk_transform_factory()
        return self.qk_transform_factory(rope_base=rope_base)

    def make_score_bias(self) -> nn.Module | None:
        """A new module ``(T, S) -> bias`` (an :class:`OffsetBias`) for one layer, or ``None``."""
        return self.score_bias_factory() if self.score_bias_factory is not None else None


@dataclass(frozen=True)
class PositionSizes:
    """What a position scheme's factory is built from (the arguments of :func:`build_positions`).

    Attributes:
        d_model: C. n_heads: H. d_head: D = C / H. max_len: rows of absolute tables.
        max_distance: relative clip distance / end of T5's log buckets. num_buckets: T5's buckets.
        rope_base: the rotary angle base. offset: first row of the learned table used
        (RoBERTa's pad id + 1; only ``learned`` takes one).
        grid: an image model's patches per axis (``()`` for text): what the 2-D schemes place
        tokens on (:mod:`qkv.nn.positional_2d`). prefix: tokens before the patches ([CLS]).
    """

    d_model: int
    n_heads: int
    d_head: int
    max_len: int
    max_distance: int = 128
    num_buckets: int = 32
    rope_base: float = 10000.0
    offset: int = 0
    grid: tuple[int, ...] = ()
    prefix: int = 0


#: The slots a position scheme fills (see :class:`PositionSlots`).
SLOTS = ("input", "qk_transform", "score_bias")


@dataclass(frozen=True)
class PositionScheme:
    """A registered position scheme: its ``slot`` (one of :data:`SLOTS`, ``None`` for ``none``) and
    ``factory(sizes: PositionSizes) -> nn.Module`` (``input``: called once; the others: once per layer)."""

    name: str
    slot: str | None
    factory: Callable[[PositionSizes], nn.Module | None]


#: Registered position schemes by name, the built-in ones (:data:`POSITIONS`) first.
POSITION_SCHEMES: dict[str, PositionScheme] = {}


def register_position(name: str, *, slot: str | None):
    """Decorator: register ``factory(sizes: PositionSizes) -> nn.Module`` as position scheme ``name``.

    ``slot`` says what the module is: ``"input"`` — ``forward(T) -> (T, C)`` added to the embeddings
    (or, with ``position_qk_only``, to the query/key inputs); ``"qk_transform"`` —
    ``forward(q, k) -> (q, k)`` on ``(B,H,T,D)`` tensors, one per layer; ``"score_bias"`` —
    ``forward(T, S) ->`` an :class:`OffsetBias` or a float tensor broadcastable to ``(B,H,T,S)``,
    one per layer. The defining module is recorded (:func:`qkv.plugins.registered_by`); outside qkv
    it is a plugin (docs/plugins.md).
    """
    if slot is not None and slot not in SLOTS:
        raise ValueError(f"register_position({name!r}): slot={slot!r} is not allowed; allowed: "
                         f"{', '.join(SLOTS)}")

    def deco(factory):
        if name in POSITION_SCHEMES:
            raise ValueError(f"position scheme {name!r} is already registered "
                             f"(by {plugins.registered_by('position', name)})")
        POSITION_SCHEMES[name] = PositionScheme(name, slot, factory)
        plugins.record_part("position", name, factory)
        return factory

    return deco


def build_positions(
    name: str,
    *,
    d_model: int,
    n_heads: int,
    max_len: int,
    qk_only: bool = False,
    max_distance: int = 128,
    num_buckets: int = 32,
    rope_base: float = 10000.0,
    offset: int = 0,
    grid: tuple[int, ...] = (),
    prefix: int = 0,
) -> PositionSlots:
    """The slots of position scheme ``name`` (one of :data:`POSITION_SCHEMES`).

    Args:
        name: ``none``, ``sinusoidal``, ``learned``, ``relative``, ``relative-alibi``, ``t5``,
            ``alibi``, ``rope`` or a registered one (:func:`register_position`).
        d_model: C. n_heads: H (must divide C). max_len: rows of the absolute tables.
        qk_only: absolute encodings only — add them where q and k are computed, not to the values.
        max_distance: clip distance of ``relative``; end of the log buckets of ``t5``.
        num_buckets: buckets of ``t5``. rope_base: the angle base of ``rope``.
        offset: ``learned`` only: first table row used (the table has ``max_len + offset`` rows).
        grid: an image model's patches per axis; prefix: tokens before them ([CLS]). The 2-D
            schemes (``sinusoidal-2d``, ``rope-2d``) need a grid; the others read the patches in
            reading order as a 1-D sequence.

    Raises:
        ValueError: an unknown name, ``qk_only`` with a non-absolute encoding, bad sizes.
    """
    if name not in POSITION_SCHEMES:
        plugins.load_plugins()  # a miss: the installed plugins may register it
    if name not in POSITION_SCHEMES:
        raise ValueError(plugins.unknown_part("position encoding", name, POSITION_SCHEMES))
    scheme = POSITION_SCHEMES[name]
    if qk_only and scheme.slot != "input":
        absolute = [n for n, s in POSITION_SCHEMES.items() if s.slot == "input"]
        raise ValueError(
            f"qk_only=True adds an absolute encoding to the query/key inputs; it needs one of "
            f"{', '.join(absolute)}, got {name!r} (relative encodings act on q, k or scores already)"
        )
    check_sizes(d_model=d_model, n_heads=n_heads, max_len=max_len)
    if d_model % n_heads:
        raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
    if offset and name != "learned":
        raise ValueError(f"a position offset ({offset}) needs the learned table; position={name!r} has none")
    sizes = PositionSizes(d_model, n_heads, d_model // n_heads, max_len, max_distance, num_buckets, rope_base,
                          offset, tuple(grid), prefix)
    if scheme.slot is None:
        return PositionSlots(None, False)
    if scheme.slot == "input":
        return PositionSlots(scheme.factory(sizes), qk_only)
    scheme.factory(sizes)  # validate now, not at the first layer
    if scheme.slot == "qk_transform":
        def make_transform(*, rope_base: float | None = None) -> nn.Module:
            """A layer's q/k transform; ``rope_base``: that layer's own rotary base (local layers)."""
            return scheme.factory(sizes if rope_base is None else dataclasses.replace(sizes, rope_base=rope_base))

        return PositionSlots(None, False, qk_transform_factory=make_transform)
    return PositionSlots(None, False, score_bias_factory=functools.partial(scheme.factory, sizes))


# the built-in schemes, registered as a plugin's would be (in the order of POSITIONS)
register_position("none", slot=None)(lambda s: None)
register_position("sinusoidal", slot="input")(lambda s: SinusoidalPositions(s.max_len, s.d_model))
register_position("learned", slot="input")(lambda s: LearnedPositions(s.max_len, s.d_model, offset=s.offset))
register_position("relative", slot="score_bias")(lambda s: RelativePositionBias(s.n_heads, s.max_distance))
register_position("relative-alibi", slot="score_bias")(
    lambda s: RelativePositionBias(s.n_heads, s.max_distance, init="alibi"))
register_position("t5", slot="score_bias")(lambda s: T5RelativeBias(s.n_heads, s.num_buckets, s.max_distance))
register_position("alibi", slot="score_bias")(lambda s: ALiBiBias(s.n_heads))
register_position("rope", slot="qk_transform")(lambda s: RotaryEmbedding(s.d_head, s.rope_base))
#: The built-in position schemes' names (of any sequence; the grid's: :data:`GRID_POSITIONS`).
POSITIONS = tuple(POSITION_SCHEMES)
# a layout of `sinusoidal` (Marian's checkpoints), registered beside the schemes above, not among them
register_position("sinusoidal-halves", slot="input")(lambda s: SinusoidalPositions(s.max_len, s.d_model, halves=True))


def _grid(sizes: PositionSizes, name: str) -> tuple[int, ...]:
    if not sizes.grid:
        raise ValueError(f"position {name!r} places patches on an image's grid; a text model has none: use "
                         "sinusoidal or rope (or build an image model, ModelConfig.image)")
    return sizes.grid


register_position("sinusoidal-2d", slot="input")(
    lambda s: SinCos2DPositions(_grid(s, "sinusoidal-2d"), s.d_model, prefix=s.prefix))
register_position("rope-2d", slot="qk_transform")(
    lambda s: AxialRotary(s.d_head, _grid(s, "rope-2d"), prefix=s.prefix, base=s.rope_base))
#: The built-in position schemes of an image model's patch grid (the 1-D ones read patches in order).
GRID_POSITIONS = ("sinusoidal-2d", "rope-2d")
