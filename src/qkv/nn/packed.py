"""Padding-free batches: several sequences back to back, and their lengths.

Legend: B sequences, T longest length, N = Σ lengths real tokens, C model width, H heads, D head dim.

A :class:`PackedBatch` is what :meth:`qkv.nn.encoder.Encoder.forward_packed` encodes: no padded
position is computed anywhere (embeddings, maps, feed-forward), and each sequence attends only to
itself. Make one from a list of sequences, or from a right-padded batch and its mask; put packed
hidden states back into a padded ``(B,T,C)`` batch with :meth:`PackedBatch.unpack`.

Attention over packed rows runs on each sequence on its own: :func:`runs_by_length` groups
consecutive sequences of one length, :func:`run_view` is such a run's ``(m,H,n,D)`` view (no copy),
:func:`first_sequences` maps a run's first row to its sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["PackedBatch", "first_sequences", "runs_by_length", "run_view"]


@dataclass(frozen=True)
class PackedBatch:
    """Sequences back to back.

    Attributes:
        input_ids: ``(N,)`` token ids.
        lengths: the length of each sequence (0 allowed), summing to N.
        token_type_ids: ``(N,)`` segment ids, or ``None`` (all 0).
    """

    input_ids: Tensor
    lengths: tuple[int, ...]
    token_type_ids: Tensor | None = None

    def __post_init__(self) -> None:
        ids = self.input_ids
        if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.is_floating_point():
            got = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"packed input_ids must be a 1-D integer tensor (N,), got {got}")
        lengths = tuple(int(n) for n in self.lengths)
        if any(n < 0 for n in lengths) or sum(lengths) != ids.numel():
            raise ValueError(f"lengths {list(lengths)[:8]} must be ≥ 0 and sum to the {ids.numel()} packed tokens")
        object.__setattr__(self, "lengths", lengths)
        tt = self.token_type_ids
        if tt is not None and tuple(tt.shape) != tuple(ids.shape):
            raise ValueError(f"packed token_type_ids must have shape (N,) = ({ids.numel()},), got {tuple(tt.shape)}")

    @classmethod
    def from_sequences(cls, sequences: Sequence[Sequence[int] | Tensor], device=None) -> PackedBatch:
        """Pack token-id sequences (lists, arrays or 1-D tensors)."""
        parts = [torch.as_tensor(s, dtype=torch.long).reshape(-1) for s in sequences]
        ids = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
        return cls(ids.to(device), tuple(len(p) for p in parts))

    @classmethod
    def from_padded(cls, input_ids: Tensor, attention_mask: Tensor,
                    token_type_ids: Tensor | None = None) -> PackedBatch:
        """Pack a right-padded ``(B,T)`` batch (each row's real tokens first, mask 1/True)."""
        mask = attention_mask.bool()
        lengths = mask.sum(dim=1)  # (B,)
        T = input_ids.shape[1]
        if not torch.equal(mask, torch.arange(T, device=mask.device) < lengths[:, None]):
            raise ValueError("attention_mask is not right-padded (each row's real tokens first); "
                             "pack left-padded batches with PackedBatch.from_sequences")
        tt = None if token_type_ids is None else token_type_ids[mask]  # (B,T) -> (N,)
        return cls(input_ids[mask], tuple(lengths.tolist()), tt)  # (B,T) -> (N,)

    @property
    def starts(self) -> Tensor:
        """``(B,)`` the packed row of each sequence's first token."""
        n = torch.tensor((0, *self.lengths[:-1]), device=self.input_ids.device)
        return n.cumsum(0)

    @property
    def max_len(self) -> int:
        return max(self.lengths, default=0)

    def positions(self) -> Tensor:
        """``(N,)`` each token's position in its own sequence."""
        parts = [torch.arange(n, device=self.input_ids.device) for n in self.lengths]
        return torch.cat(parts) if parts else self.input_ids.new_zeros(0)

    def sequence_ids(self) -> Tensor:
        """``(N,)`` the index of each token's sequence."""
        n = torch.tensor(self.lengths, device=self.input_ids.device)
        return torch.repeat_interleave(torch.arange(len(self.lengths), device=n.device), n)

    def padding_mask(self, length: int | None = None) -> Tensor:
        """``(B,T)`` boolean, True at real positions of the right-padded batch."""
        T = self.max_len if length is None else length
        n = torch.tensor(self.lengths, device=self.input_ids.device)
        return torch.arange(T, device=n.device) < n[:, None]  # (T,) vs (B,1) -> (B,T)

    def unpack(self, packed: Tensor, length: int | None = None) -> Tensor:
        """``(N,…)`` packed rows → ``(B,T,…)`` right-padded, zeros at padded positions."""
        mask = self.padding_mask(length)  # (B,T)
        out = packed.new_zeros(*mask.shape, *packed.shape[1:])  # (B,T,…)
        out[mask] = packed
        return out


def first_sequences(lengths: list[int]) -> dict[int, int]:
    """The first packed row of each non-empty sequence → that sequence's index."""
    rows, at = {}, 0
    for i, n in enumerate(lengths):
        if n:
            rows[at] = i
        at += n
    return rows


def runs_by_length(lengths: list[int]) -> list[tuple[int, int, int]]:
    """Runs of consecutive sequences of equal length n > 0: ``(first packed row, m sequences, n)``.

    Length-sorted batches give one run per distinct length; each run is a view, never a copy. An
    empty sequence ends a run: the run's m sequences are then the m that follow its first one.
    """
    runs: list[tuple[int, int, int]] = []
    at, joins = 0, False  # joins: the previous sequence is non-empty, the last of the last run
    for n in lengths:
        if n and joins and runs[-1][2] == n:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, n)
        elif n:
            runs.append((at, 1, n))
        joins = n > 0
        at += n
    return runs


def run_view(t: Tensor, start: int, m: int, n: int) -> Tensor:
    """``(H,N,D)`` → the ``(m,H,n,D)`` view of m consecutive packed sequences of length n."""
    return t[:, start : start + m * n].unflatten(1, (m, n)).transpose(0, 1)  # (H,m·n,D) -> (H,m,n,D) -> (m,H,n,D)
