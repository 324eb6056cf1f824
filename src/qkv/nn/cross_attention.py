"""Cross-attention: queries from the decoder, keys and values from the encoder (Prince Fig. 12.13).

Legend: B batch, T decoder length, S encoder (memory) length, H heads, G key/value heads,
D head dim, C decoder width (= H·D), E encoder width.

::

    q    = X_dec Ω_q                  (B,T,C) -> (B,H,T,D)
    k, v = X_enc Ω_kv                 one fused E → 2·G·D map: (B,S,E) -> 2 × (B,G,S,D)
    o    = attend(q, k, v, mask)      softmax over the encoder's keys for each decoder query
    out  = merge(o) Ω_o               (B,T,C)

No positions enter cross-attention: queries and keys live in different sequences, so an offset
``j - i`` between a decoder and an encoder position means nothing; each side carries its own
positions from its own self-attention. The memory's keys and values are the same for every
decoding step: :meth:`CrossAttention.project_memory` computes them once per generation.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from qkv import plugins
from qkv.nn.attend import attend
from qkv.nn.attention import check_heads
from qkv.nn.backends import backend_names

__all__ = ["CrossAttention", "CrossAttentionOutput"]


@dataclass
class CrossAttentionOutput:
    """Result of :class:`CrossAttention`.

    Attributes:
        output: ``(B,T,C)``.
        weights: ``(B,H,T,S)`` weights of each decoder query over the memory (before dropout), or ``None``.
    """

    output: Tensor
    weights: Tensor | None = None


class CrossAttention(nn.Module):
    """Multi-head cross-attention of decoder states over an encoder's output (the memory).

    Args:
        d_model: decoder width C. n_heads: heads H (must divide C).
        similarity: a similarity module (:mod:`qkv.nn.similarity`) built for H heads of width D.
        q_proj: ``nn.Linear(C, C)``, the query map Ω_q.
        kv_proj: ``nn.Linear(E, 2·G·D)``, the fused key/value map (rows ``[0:G·D]`` keys, then values).
        out_proj: ``nn.Linear(C, C)``, or ``None``.
        n_kv_heads: key/value heads G (dividing H), ``None`` = H.
        qk_norm: optional module ``(q, k) -> (q, k)`` normalising each head over D
            (:class:`~qkv.nn.qk_norm.QKNorm`; its ``k_norm`` is applied in :meth:`project_memory`).
        dropout: dropout on the attention weights.
        backend: ``"auto"`` or a registered attention backend. chunk_size: for the chunked backend.
    """

    def __init__(self, d_model: int, n_heads: int, *, similarity: nn.Module, q_proj: nn.Linear, kv_proj: nn.Linear,
                 out_proj: nn.Linear | None, n_kv_heads: int | None = None, qk_norm: nn.Module | None = None,
                 dropout: float = 0.0, backend: str = "auto", chunk_size: int | None = None):
        super().__init__()
        check_heads(d_model, n_heads)
        G = n_heads if n_kv_heads is None else n_kv_heads
        if isinstance(G, bool) or not isinstance(G, int) or G < 1 or n_heads % G:
            raise ValueError(f"n_kv_heads={n_kv_heads!r} must be a positive int dividing n_heads={n_heads}")
        D = d_model // n_heads
        if not isinstance(q_proj, nn.Linear) or tuple(q_proj.weight.shape) != (d_model, d_model):
            raise ValueError(f"q_proj must be an nn.Linear({d_model}, {d_model})")
        if not isinstance(kv_proj, nn.Linear) or kv_proj.weight.shape[0] != 2 * G * D:
            raise ValueError(f"kv_proj must be an nn.Linear(E, 2·G·D = {2 * G * D})")
        if out_proj is not None and (not isinstance(out_proj, nn.Linear)
                                     or tuple(out_proj.weight.shape) != (d_model, d_model)):
            raise ValueError(f"out_proj must be an nn.Linear({d_model}, {d_model}) or None")
        if backend not in backend_names():
            plugins.load_plugins()
        if backend not in backend_names():
            raise ValueError(plugins.unknown_part("attention backend", backend, backend_names()))
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.n_heads, self.n_kv_heads, self.d_head = d_model, n_heads, G, D
        self.d_memory = kv_proj.weight.shape[1]
        self.similarity, self.q_proj, self.kv_proj, self.out_proj = similarity, q_proj, kv_proj, out_proj
        self.qk_norm, self.dropout, self.backend, self.chunk_size = qk_norm, dropout, backend, chunk_size

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of the memory: ``(B,S,E)`` → 2 × ``(B,G,S,D)`` (k-norm applied).

        Computed once per generation and passed back as ``memory_kv``.
        """
        if not isinstance(memory, Tensor) or memory.dim() != 3 or memory.shape[-1] != self.d_memory:
            got = tuple(memory.shape) if isinstance(memory, Tensor) else type(memory).__name__
            raise ValueError(f"memory must be a (B, S, E={self.d_memory}) tensor, got {got}")
        G, D = self.n_kv_heads, self.d_head
        kv = self.kv_proj(memory)  # (B,S,E) -> (B,S,2GD)
        k, v = kv.unflatten(-1, (2, G, D)).unbind(2)  # (B,S,2GD) -> (B,S,2,G,D) -> 2 × (B,S,G,D)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B,S,G,D) -> (B,G,S,D)
        if self.qk_norm is not None:
            k = self.qk_norm.k_norm(k)
        return k, v

    def forward(self, x: Tensor, memory: Tensor | None, memory_mask: Tensor | None = None, *,
                need_weights: bool = False, memory_kv: tuple[Tensor, Tensor] | None = None) -> CrossAttentionOutput:
        """Attend from ``x`` over ``memory``.

        Args:
            x: ``(B,T,C)`` decoder states (the queries).
            memory: ``(B,S,E)`` encoder output (keys and values); may be ``None`` with ``memory_kv``.
            memory_mask: ``(B,S)`` boolean or 0/1, True = real source token (padding is never attended).
            need_weights: also return the ``(B,H,T,S)`` weights.
            memory_kv: the memory's keys and values from :meth:`project_memory` (then ``memory`` is not read).

        Returns:
            :class:`CrossAttentionOutput`.
        """
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be a (B, T, C={self.d_model}) tensor, got {got}")
        if memory_kv is None:
            if memory is None:
                raise ValueError("cross-attention needs memory (B,S,E) or memory_kv from project_memory")
            memory_kv = self.project_memory(memory)
        k, v = memory_kv  # (B,G,S,D)
        B, T, C = x.shape
        S = k.shape[2]
        if k.shape[0] != B:
            raise ValueError(f"memory has batch {k.shape[0]}, but x has batch {B}")
        mask = None
        if memory_mask is not None:
            if tuple(memory_mask.shape) != (B, S):
                raise ValueError(f"memory_mask must have shape (B, S) = ({B}, {S}), got {tuple(memory_mask.shape)}")
            keep = memory_mask.bool()
            if not bool(keep.all()):
                mask = keep[:, None, None, :]  # (B,S) -> (B,1,1,S)
        q = self.q_proj(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B,T,C) -> (B,T,H,D) -> (B,H,T,D)
        if self.qk_norm is not None:
            q = self.qk_norm.q_norm(q)
        res = attend(q, k, v, similarity=self.similarity, mask=mask, dropout_p=self.dropout if self.training else 0.0,
                     need_weights=need_weights, backend=self.backend, chunk_size=self.chunk_size)
        out = res.output.transpose(1, 2).reshape(B, T, C)  # (B,H,T,D) -> (B,T,H,D) -> (B,T,C)
        if self.out_proj is not None:
            out = self.out_proj(out)  # (B,T,C) -> (B,T,C)
        return CrossAttentionOutput(out, res.weights)

    def extra_repr(self) -> str:
        kv = f", n_kv_heads={self.n_kv_heads}" if self.n_kv_heads != self.n_heads else ""
        return f"d_model={self.d_model}, d_memory={self.d_memory}, n_heads={self.n_heads}{kv}, backend={self.backend!r}"
