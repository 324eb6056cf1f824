"""qk-norm: each head's queries and keys normalised over the head width before the similarity.

Legend: B batch, H heads, G key/value heads, T query length, S key length, D head dim.

``q ← norm_q(q)``, ``k ← norm_k(k)`` per head and position, over D (Henry et al. 2020;
Dehghani et al. 2023, ViT-22B; OLMo 2, Qwen3): bounds the logits qᵀk, which otherwise grow with
the weights and make the softmax collapse to one key in large or long-trained models.
:class:`~qkv.nn.attention.MultiHeadAttention` applies it after the projection and before the
rotary transform (Qwen3's order). The two norms have their own scales (Qwen3's ``q_norm``,
``k_norm``).
"""

from __future__ import annotations

from torch import Tensor, nn

from qkv.nn.norms import RMSNorm

__all__ = ["QKNorm", "QK_NORM_TYPES", "build_qk_norm"]

#: The qk-norm kinds :func:`build_qk_norm` makes (``"none"``: no module).
QK_NORM_TYPES = ("none", "layernorm", "rmsnorm")


class QKNorm(nn.Module):
    """``(q, k) -> (norm_q(q), norm_k(k))`` on ``(B,H,T,D)`` and ``(B,G,S,D)`` tensors.

    Args:
        q_norm: the norm of the queries over D. k_norm: the norm of the keys over D.
    """

    def __init__(self, q_norm: nn.Module, k_norm: nn.Module):
        super().__init__()
        self.q_norm, self.k_norm = q_norm, k_norm

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return self.q_norm(q), self.k_norm(k)  # (B,H,T,D), (B,G,S,D): over the last dim


def build_qk_norm(kind: str, d_head: int, *, scale: bool = True, eps: float = 1e-6) -> QKNorm | None:
    """The qk-norm ``kind`` (one of :data:`QK_NORM_TYPES`) over heads of width ``d_head``, or ``None``.

    Args:
        kind: ``"none"``, ``"layernorm"`` (``nn.LayerNorm(D)``) or ``"rmsnorm"``
            (:class:`~qkv.nn.norms.RMSNorm`).
        d_head: D. scale: a learned per-dimension scale (γ; LayerNorm's β with it).
        eps: the norms' ε.
    """
    if kind not in QK_NORM_TYPES:
        raise ValueError(f"unknown qk_norm {kind!r}; allowed: {', '.join(QK_NORM_TYPES)}")
    if kind == "none":
        return None

    def one() -> nn.Module:
        if kind == "layernorm":
            return nn.LayerNorm(d_head, eps=eps, elementwise_affine=scale)
        return RMSNorm(d_head, eps=eps, scale=scale)

    return QKNorm(one(), one())
