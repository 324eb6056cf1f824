"""The textbook's self-attention in NumPy (Prince, *Understanding Deep Learning*, ch. 12).

Everything here follows the book's **column convention**: an input ``X`` is ``D×N`` with one
column per token, biases are ``D×1`` columns broadcast over tokens (``β 1ᵀ``), and the attention
matrix ``Softmax[KᵀQ]`` is ``N×N`` with one column per *query* (softmax runs down each column,
i.e. over the keys).

Legend: D model width (rows of X), N tokens, D_q rows of the query/key maps, H heads.

This module is the independent reference that the PyTorch code is tested against; it favours
transcribing the equations over speed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "softmax_cols",
    "self_attention",
    "self_attention_per_token",
    "multihead_self_attention",
]


def softmax_cols(A: np.ndarray) -> np.ndarray:
    """Softmax of each column of ``A`` (numerically stable: the column max is subtracted).

    Args:
        A: ``(M, N)`` array.

    Returns:
        ``(M, N)`` array whose columns are non-negative and sum to one.
    """
    A = np.asarray(A)
    if A.ndim != 2:
        raise ValueError(f"softmax_cols expects a 2-D array (M×N), got shape {A.shape}")
    shifted = A - A.max(axis=0, keepdims=True)  # (M, N)
    e = np.exp(shifted)
    return e / e.sum(axis=0, keepdims=True)


def _check_map(name: str, omega: np.ndarray, beta: np.ndarray, d_in: int) -> None:
    if omega.ndim != 2 or omega.shape[1] != d_in:
        raise ValueError(f"{name}: omega must be (rows × {d_in}), got shape {omega.shape}")
    if beta.shape not in ((omega.shape[0], 1), (omega.shape[0],)):
        raise ValueError(
            f"{name}: beta must be ({omega.shape[0]} × 1) to match omega, got shape {beta.shape}"
        )


def _linear_cols(X: np.ndarray, omega: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """``β 1ᵀ + Ω X`` — the book's per-column affine map.  X (D,N) → (rows, N)."""
    N = X.shape[1]
    return beta.reshape(-1, 1) @ np.ones((1, N)) + omega @ X  # (rows,1)(1,N) + (rows,D)(D,N)


def _qkv(X, omega_v, beta_v, omega_q, beta_q, omega_k, beta_k):
    X = np.asarray(X, dtype=np.float64) if np.asarray(X).dtype.kind != "f" else np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"X must be D×N (one column per token), got shape {X.shape}")
    D = X.shape[0]
    for name, om, be in (("V", omega_v, beta_v), ("Q", omega_q, beta_q), ("K", omega_k, beta_k)):
        _check_map(name, np.asarray(om), np.asarray(be), D)
    if np.shape(omega_q)[0] != np.shape(omega_k)[0]:
        raise ValueError(
            f"queries and keys need the same number of rows, got Ω_q {np.shape(omega_q)} "
            f"and Ω_k {np.shape(omega_k)}"
        )
    V = _linear_cols(X, omega_v, beta_v)  # (D_v, N)
    Q = _linear_cols(X, omega_q, beta_q)  # (D_q, N)
    K = _linear_cols(X, omega_k, beta_k)  # (D_q, N)
    return V, Q, K


def self_attention(X, omega_v, beta_v, omega_q, beta_q, omega_k, beta_k, scaled=False):
    """Sa[X] = V · Softmax[KᵀQ] (the book's eq. 12.11; with ``scaled`` eq. 12.12).

    Args:
        X: ``(D, N)`` input, one column per token.
        omega_v, omega_q, omega_k: ``(D_v, D)``, ``(D_q, D)``, ``(D_q, D)`` maps.
        beta_v, beta_q, beta_k: matching ``(rows, 1)`` biases.
        scaled: divide ``KᵀQ`` by ``√D_q`` (the number of rows of ``Ω_q``).

    Returns:
        ``(D_v, N)`` output, column n is the attended value for token n.
    """
    V, Q, K = _qkv(X, omega_v, beta_v, omega_q, beta_q, omega_k, beta_k)
    scores = K.T @ Q  # (N, D_q)(D_q, N) -> (N keys, N queries)
    if scaled:
        scores = scores / np.sqrt(Q.shape[0])
    return V @ softmax_cols(scores)  # (D_v, N)(N, N) -> (D_v, N)


def self_attention_per_token(X, omega_v, beta_v, omega_q, beta_q, omega_k, beta_k, scaled=False):
    """The per-token form: sa_n[x_1..x_N] = Σ_m a[x_m, x_n] v_m (the book's eqs. 12.2–12.6).

    A deliberately literal double loop over queries n and keys m; it must equal
    :func:`self_attention`.
    """
    X = np.asarray(X, dtype=np.float64) if np.asarray(X).dtype.kind != "f" else np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"X must be D×N (one column per token), got shape {X.shape}")
    N = X.shape[1]
    bv, bq, bk = (np.asarray(b).reshape(-1) for b in (beta_v, beta_q, beta_k))
    v = [bv + omega_v @ X[:, m] for m in range(N)]  # v_m = β_v + Ω_v x_m
    q = [bq + omega_q @ X[:, n] for n in range(N)]
    k = [bk + omega_k @ X[:, m] for m in range(N)]
    d_q = np.shape(omega_q)[0]
    out = np.zeros((np.shape(omega_v)[0], N), dtype=np.result_type(X, omega_v))
    for n in range(N):
        s = np.array([k[m] @ q[n] for m in range(N)])  # similarity of query n with every key m
        if scaled:
            s = s / np.sqrt(d_q)
        s = s - s.max()
        a = np.exp(s) / np.exp(s).sum()  # a[x_m, x_n]
        for m in range(N):
            out[:, n] += a[m] * v[m]
    return out


def multihead_self_attention(
    X, heads: Sequence[tuple[np.ndarray, ...]], omega_c: np.ndarray
) -> np.ndarray:
    """MhSa[X] = Ω_c [Sa_1[X]ᵀ, …, Sa_H[X]ᵀ]ᵀ (the book's eq. 12.14).

    Args:
        X: ``(D, N)`` input.
        heads: H tuples ``(omega_v, beta_v, omega_q, beta_q, omega_k, beta_k)``, each map
            ``(D/H, D)`` and each bias ``(D/H, 1)``.
        omega_c: ``(D, D)`` output map applied to the heads stacked vertically (head 1 on top).

    Returns:
        ``(D, N)``. Every head is scaled by ``√(D/H)``.
    """
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"X must be D×N (one column per token), got shape {X.shape}")
    if len(heads) == 0:
        raise ValueError("heads must hold at least one (Ω_v, β_v, Ω_q, β_q, Ω_k, β_k) tuple")
    D = X.shape[0]
    H = len(heads)
    if D % H != 0:
        raise ValueError(f"D={D} is not divisible by the number of heads H={H}")
    outs = []
    for h, head in enumerate(heads):
        if len(head) != 6:
            raise ValueError(f"head {h} must be (Ω_v, β_v, Ω_q, β_q, Ω_k, β_k), got {len(head)} items")
        for om in head[0::2]:
            if np.shape(om) != (D // H, D):
                raise ValueError(f"head {h}: each map must be ({D // H} × {D}), got {np.shape(om)}")
        outs.append(self_attention(X, *head, scaled=True))  # (D/H, N)
    stacked = np.concatenate(outs, axis=0)  # H × (D/H, N) -> (D, N)
    if np.shape(omega_c) != (D, stacked.shape[0]):
        raise ValueError(f"omega_c must be ({D} × {stacked.shape[0]}), got {np.shape(omega_c)}")
    return omega_c @ stacked  # (D, D)(D, N)
