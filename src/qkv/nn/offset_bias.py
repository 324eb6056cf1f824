"""Score biases that depend only on the offset of key from query (relative, T5, ALiBi positions).

Legend: H heads, T query length, S key length, L = T+S-1 offsets, n table entries.

An :class:`OffsetBias` is ``bias[h, i, j] = table[h, index[j - i + T - 1]]``: a table of per-head
values and the table entry of each offset. It never materialises the ``(H,T,S)`` tensor: it is a
row-block function ``(start, stop) -> (1,H,stop-start,S)`` for the explicit, chunked and in-place
backends, and :mod:`qkv.nn.backends.offset_flash` runs it on torch's fused flash kernel (memory
linear in T), learned-table gradient included.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["OffsetBias", "toeplitz_rows"]


def toeplitz_rows(values: Tensor, q_len: int, k_len: int, start: int, stop: int) -> Tensor:
    """Rows ``[start, stop)`` of the Toeplitz bias ``bias[h, i, j] = values[h, j - i + T - 1]``.

    Args:
        values: ``(H, L)`` per-offset values, ``L = T + S - 1``, entry ``d + T - 1`` for offset d.

    Returns:
        ``(H, stop-start, S)``; differentiable in ``values``.
    """
    t = stop - start
    lo = q_len - stop  # entry of (row stop-1, key 0)
    win = values[:, lo : lo + k_len + t - 1].unfold(-1, k_len, 1)  # (H,L') -> (H,t,S), window w = row t-1-w
    return win.flip(1)  # (H,t,S), row r = query start + r


class OffsetBias:
    """A score bias that depends only on the offset ``d = j - i``: ``table[h, index[d + T - 1]]``.

    Args:
        table: ``(H, n)`` values (may require grad; a transposed parameter view is fine).
        index: ``(T + S - 1,)`` long, the table entry of each offset ``d = -(T-1) … S-1``.
        q_len: T. k_len: S.
    """

    def __init__(self, table: Tensor, index: Tensor, q_len: int, k_len: int):
        if table.dim() != 2 or not table.is_floating_point():
            raise ValueError(
                f"table must be a floating (H, n) tensor, got {tuple(table.shape)} {table.dtype}"
            )
        if index.dim() != 1 or index.dtype != torch.long or index.numel() != q_len + k_len - 1:
            raise ValueError(
                f"index must be a 1-D long tensor of T+S-1 = {q_len + k_len - 1} entries, "
                f"got {tuple(index.shape)} {index.dtype}"
            )
        self.table, self.index, self.q_len, self.k_len = table, index, q_len, k_len
        self._radius: int | None = None

    @property
    def n_heads(self) -> int:
        return self.table.shape[0]

    @property
    def requires_grad(self) -> bool:
        return self.table.requires_grad and torch.is_grad_enabled()

    def values(self) -> Tensor:
        """``(H, T+S-1)`` bias of each offset (differentiable in the table)."""
        return self.table[:, self.index]  # (H,n) -> (H,L)

    def __call__(self, start: int, stop: int) -> Tensor:
        """Rows ``[start, stop)`` of the bias, ``(1, H, stop-start, S)`` (the row-block protocol)."""
        return toeplitz_rows(self.values(), self.q_len, self.k_len, start, stop)[None]

    def dense(self) -> Tensor:
        """The whole bias, ``(1, H, T, S)``."""
        return self(0, self.q_len)

    def causal(self) -> OffsetBias:
        """This bias with the causal mask folded in: every offset ``d > S - T`` (a key after its
        query, queries aligned with the last keys) reads one extra table entry of −∞.

        The result is still an offset bias, so the fused kernel runs causal attention with a
        relative, T5 or ALiBi bias (a causal mask beside a bias it cannot take); the learned
        table's gradient is unchanged (the −∞ entry is a constant).
        """
        H, T, S = self.table.shape[0], self.q_len, self.k_len
        d = torch.arange(-(T - 1), S, device=self.index.device)  # (L,) every offset
        table = torch.cat([self.table, self.table.new_full((H, 1), float("-inf"))], 1)  # (H,n) -> (H,n+1)
        index = torch.where(d > S - T, self.table.shape[1], self.index)  # (L,)
        return OffsetBias(table, index, T, S)

    def radius(self) -> int:
        """Smallest R ≥ 1 such that ``index`` is constant for ``d ≤ -R`` and for ``d ≥ R``."""
        if self._radius is None:
            idx, T = self.index.cpu(), self.q_len
            left = (idx != idx[0]).nonzero()
            right = (idx != idx[-1]).nonzero()
            r_left = T - int(left[0]) if len(left) else 0  # first entry that differs from d = -(T-1)
            r_right = int(right[-1]) - T + 2 if len(right) else 0  # last entry differing from d = S-1
            self._radius = max(1, r_left, r_right)
        return self._radius
