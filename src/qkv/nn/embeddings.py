"""Token + position + segment embeddings: the input of an encoder or a decoder stack.

Legend: B batch, T length, C model width (E when the embeddings are narrower), N packed tokens.
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["Embeddings", "positions_at"]


def positions_at(positions: nn.Module, position_ids: Tensor) -> Tensor:
    """The rows of an input position encoding (``length -> (L,C)``) at ``position_ids`` (any shape,
    non-empty): ``(…)`` ids -> ``(…,C)``."""
    return positions(int(position_ids.max()) + 1)[position_ids]  # (L,C)[(…)] -> (…,C)


class Embeddings(nn.Module):
    """Token + position + segment embeddings, then a norm and dropout (BERT's order)::

        x = Dropout(Norm(s · E[ids] + P[:T] + S[segments]))

    with ``s = token_scale`` (1, BERT; √C with ``embed_scale``, Vaswani et al. 2017 §3.4).

    Args:
        vocab_size: V.
        d_model: C.
        norm: the norm applied to the sum, ``(…,C) -> (…,C)`` (a LayerNorm, RMSNorm, …).
        type_vocab_size: number of segment ids (0: no segment embeddings).
        positions: module ``length -> (T,C)`` added to the token embeddings, or ``None``.
        pad_token_id: row of the token table that starts at zero and gets no gradient.
        dropout: dropout after the norm.
        token_scale: the token embeddings are multiplied by it before positions and segments
            are added.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        *,
        norm: nn.Module,
        type_vocab_size: int = 2,
        positions: nn.Module | None = None,
        pad_token_id: int | None = 0,
        dropout: float = 0.1,
        token_scale: float = 1.0,
    ):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, d_model, padding_idx=pad_token_id)
        self.token_scale = float(token_scale)
        self.positions = positions
        self.segments = nn.Embedding(type_vocab_size, d_model) if type_vocab_size > 0 else None
        self.norm = norm
        self.dropout = nn.Dropout(dropout)

    def _tokens(self, input_ids: Tensor) -> Tensor:
        """``s · E[ids]``: ``(…)`` ids -> ``(…,C)``."""
        x = self.tokens(input_ids)  # (…) -> (…,C)
        return x * self.token_scale if self.token_scale != 1.0 else x

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None) -> Tensor:
        """``(B,T)`` ids (and optional ``(B,T)`` segment ids) → ``(B,T,C)``.

        ``position_ids``: ``(B,T)`` or ``(T,)`` position of each token (default ``0 … T-1``), e.g.
        counted from each row's first real token in a left-padded batch, or continuing a prefix.
        """
        x = self._tokens(input_ids)  # (B,T) -> (B,T,C)
        if self.positions is not None:
            if position_ids is None:
                x = x + self.positions(input_ids.shape[1])  # (B,T,C) + (T,C)
            elif position_ids.numel():
                x = x + positions_at(self.positions, position_ids)  # (B,T,C) + (B,T,C)
        if self.segments is not None:
            if token_type_ids is None:
                x = x + self.segments.weight[0]  # (B,T,C) + (C,): every token in segment 0
            else:
                x = x + self.segments(token_type_ids)  # (B,T) -> (B,T,C)
        return self.dropout(self.norm(x))

    def forward_packed(self, input_ids: Tensor, positions: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """Packed ``(N,)`` ids, each token's ``(N,)`` position in its sequence (and segment ids) → ``(N,C)``."""
        x = self._tokens(input_ids)  # (N,) -> (N,C)
        if self.positions is not None and len(positions):
            x = x + positions_at(self.positions, positions)  # (N,C)
        if self.segments is not None:
            x = x + (self.segments.weight[0] if token_type_ids is None else self.segments(token_type_ids))
        return self.dropout(self.norm(x))
