"""The key/value cache of incremental (autoregressive) decoding.

Legend: B batch, G key/value heads, S cached positions, T new positions, D head dim, H heads.

A causal stack's keys and values at positions 0 … S-1 do not change when a token is appended, so
each step needs to project only the new tokens and attend their queries over all S keys. A
:class:`LayerCache` holds one layer's keys and values ``(B,G,S,D)`` — after qk-norm, and, for the
built-in rotary embedding, already rotated at their own positions — in a preallocated buffer that
grows by doubling (or to the requested capacity). A :class:`KVCache` is the model's: one
:class:`LayerCache` per layer and the number of positions seen.

:meth:`qkv.nn.attention.MultiHeadAttention.forward` (``cache=``) writes it;
:func:`end_aligned_bias` gives a score-bias module's bias for queries at positions S-T … S-1.
Inference only: the buffer is written in place (no autograd through it).
"""

from __future__ import annotations

from torch import Tensor

from qkv.nn.offset_bias import OffsetBias

__all__ = ["LayerCache", "KVCache", "end_aligned_bias"]


class LayerCache:
    """One attention layer's cached keys and values.

    Args:
        capacity: positions to allocate on first use (at least the first append's length); the
            buffer doubles when full. ``None``: the first append's length.
    """

    def __init__(self, capacity: int | None = None):
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be a positive int or None, got {capacity!r}")
        self.capacity_hint = capacity
        self._k: Tensor | None = None  # (B,G,capacity,D)
        self._v: Tensor | None = None  # (B,G,capacity,E)
        self.length = 0  # filled positions S

    @property
    def capacity(self) -> int:
        return 0 if self._k is None else self._k.shape[2]

    def keys(self) -> Tensor | None:
        """``(B,G,S,D)`` view of the filled keys (``None`` before the first append)."""
        return None if self._k is None else self._k[:, :, : self.length]

    def values(self) -> Tensor | None:
        """``(B,G,S,E)`` view of the filled values."""
        return None if self._v is None else self._v[:, :, : self.length]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k (B,G,T,D)`` and ``v (B,G,T,E)``; return the views of all ``S`` keys and values."""
        B, G, T, _ = k.shape
        if self._k is not None and (self._k.shape[:2] != (B, G) or self._k.dtype != k.dtype
                                    or self._k.device != k.device):
            raise ValueError(f"cache holds (B,G) = {tuple(self._k.shape[:2])} {self._k.dtype}, got "
                             f"{(B, G)} {k.dtype}: one cache serves one batch; start a new KVCache")
        need = self.length + T
        if need > self.capacity:
            cap = max(need, 2 * self.capacity, self.capacity_hint or 0)
            new_k = k.new_empty(B, G, cap, k.shape[-1])  # (B,G,cap,D)
            new_v = v.new_empty(B, G, cap, v.shape[-1])  # (B,G,cap,E)
            if self.length:
                new_k[:, :, : self.length] = self._k[:, :, : self.length]
                new_v[:, :, : self.length] = self._v[:, :, : self.length]
            self._k, self._v = new_k, new_v
        self._k[:, :, self.length : need] = k
        self._v[:, :, self.length : need] = v
        self.length = need
        return self._k[:, :, :need], self._v[:, :, :need]  # (B,G,S,D), (B,G,S,E) views

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (``(B',)`` long; repeats allowed): beam search's surviving beams."""
        if self._k is not None:
            self._k = self._k.index_select(0, index)  # (B,G,cap,D) -> (B',G,cap,D)
            self._v = self._v.index_select(0, index)  # (B,G,cap,E) -> (B',G,cap,E)


class KVCache:
    """The model-level cache: one :class:`LayerCache` per layer and the positions seen.

    Args:
        n_layers: layers of the stack (caches are made on first use when ``None``).
        capacity: positions each layer preallocates (e.g. prompt + new tokens), or ``None``.
    """

    def __init__(self, n_layers: int | None = None, *, capacity: int | None = None):
        self.capacity = capacity
        self.layers: list[LayerCache] = [LayerCache(capacity) for _ in range(n_layers or 0)]
        self.seen = 0  # positions 0 … seen-1 are cached

    def layer(self, i: int) -> LayerCache:
        """Layer ``i``'s cache (made on first use)."""
        while len(self.layers) <= i:
            self.layers.append(LayerCache(self.capacity))
        return self.layers[i]

    def reorder(self, index: Tensor) -> None:
        """Every layer keeps batch rows ``index`` (:meth:`LayerCache.reorder`)."""
        for layer in self.layers:
            layer.reorder(index)

    def __len__(self) -> int:
        return self.seen

    def __repr__(self) -> str:
        return f"KVCache(layers={len(self.layers)}, seen={self.seen})"


def end_aligned_bias(full, q_len: int, k_len: int):
    """The ``T × S`` bias of queries at positions S-T … S-1 from a module's ``S × S`` bias ``full``.

    An :class:`OffsetBias` ``bias[h,i,j] = table[index[j - i + S - 1]]`` over ``S × S`` becomes, for
    query row ``i' = i - (S - T)``, ``table[index[j - i' + T - 1]]``: the same table and the first
    ``S + T - 1`` index entries. A dense tensor bias ``(…,S,S)``: its last T rows.
    """
    T, S = q_len, k_len
    if isinstance(full, OffsetBias):
        return OffsetBias(full.table, full.index[: S + T - 1], T, S)
    if isinstance(full, Tensor) and full.dim() >= 2 and full.shape[-2] == S and T < S:
        return full[..., S - T :, :]  # (…,S,S) -> (…,T,S)
    return full
