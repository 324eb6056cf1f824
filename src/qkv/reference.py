"""The textbook's self-attention in NumPy (Prince, *Understanding Deep Learning*, ch. 12).

Everything here follows the book's **column convention**: an input ``X`` is ``D×N`` with one
column per token, biases are ``D×1`` columns broadcast over tokens (``β 1ᵀ``), and the attention
matrix ``Softmax[KᵀQ]`` is ``N×N`` with one column per *query* (softmax runs down each column,
i.e. over the keys).

Masks follow the same layout as ``KᵀQ``: an ``N_k×N_q`` boolean matrix indexed [key m, query n],
True = query n may attend to key m. A masked entry of ``KᵀQ`` is −∞ before the column softmax,
and a query whose keys are all masked gets a column of zero weights (so a zero output column) —
the convention of :func:`qkv.nn.attend.attend`.

Legend: D model width (rows of X), N tokens, D_q rows of the query/key maps, D_v rows of the
value map, H heads; in cross-attention N_dec decoder tokens (queries) and N_enc encoder tokens
(keys and values), D_dec and D_enc their widths.

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
    "causal_mask",
    "masked_softmax_cols",
    "masked_self_attention",
    "masked_self_attention_per_token",
    "cross_attention",
    "multihead_cross_attention",
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


def _tokens(X, name: str = "X", rows: str = "D", cols: str = "N") -> np.ndarray:
    """``X`` as a float array, checked to be a matrix with one column per token."""
    X = np.asarray(X, dtype=np.float64) if np.asarray(X).dtype.kind != "f" else np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"{name} must be {rows}×{cols} (one column per token), got shape {X.shape}")
    return X


def _check_rows_match(omega_q, omega_k) -> None:
    if np.shape(omega_q)[0] != np.shape(omega_k)[0]:
        raise ValueError(
            f"queries and keys need the same number of rows, got Ω_q {np.shape(omega_q)} "
            f"and Ω_k {np.shape(omega_k)}"
        )


def _qkv(X, omega_v, beta_v, omega_q, beta_q, omega_k, beta_k):
    X = _tokens(X)
    D = X.shape[0]
    for name, om, be in (("V", omega_v, beta_v), ("Q", omega_q, beta_q), ("K", omega_k, beta_k)):
        _check_map(name, np.asarray(om), np.asarray(be), D)
    _check_rows_match(omega_q, omega_k)
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
    X, heads: Sequence[tuple[np.ndarray, ...]], omega_c: np.ndarray, *, causal: bool = False,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """MhSa[X] = Ω_c [Sa_1[X]ᵀ, …, Sa_H[X]ᵀ]ᵀ (the book's eq. 12.14).

    Args:
        X: ``(D, N)`` input.
        heads: H tuples ``(omega_v, beta_v, omega_q, beta_q, omega_k, beta_k)``, each map
            ``(D/H, D)`` and each bias ``(D/H, 1)``.
        omega_c: ``(D, D)`` output map applied to the heads stacked vertically (head 1 on top).
        causal: every head is masked self-attention (:func:`masked_self_attention`): query n
            attends to keys m ≤ n only.
        mask: optional ``(N, N)`` boolean mask [key m, query n] shared by every head (True = may
            attend), combined with ``causal``.

    Returns:
        ``(D, N)``. Every head is scaled by ``√(D/H)``.
    """
    X = _tokens(X)
    D = X.shape[0]
    _check_heads(heads, D, D, D)
    if causal or mask is not None:
        outs = [masked_self_attention(X, *head, scaled=True, causal=causal, mask=mask) for head in heads]
    else:
        outs = [self_attention(X, *head, scaled=True) for head in heads]  # H × (D/H, N)
    return _combine(outs, omega_c, D)


def _check_heads(heads, D: int, d_q_in: int, d_kv_in: int) -> None:
    """H head tuples whose query map is ``(D/H, d_q_in)`` and key/value maps ``(D/H, d_kv_in)``."""
    if len(heads) == 0:
        raise ValueError("heads must hold at least one (Ω_v, β_v, Ω_q, β_q, Ω_k, β_k) tuple")
    H = len(heads)
    if D % H != 0:
        raise ValueError(f"D={D} is not divisible by the number of heads H={H}")
    for h, head in enumerate(heads):
        if len(head) != 6:
            raise ValueError(f"head {h} must be (Ω_v, β_v, Ω_q, β_q, Ω_k, β_k), got {len(head)} items")
        for om, width in zip(head[0::2], (d_kv_in, d_q_in, d_kv_in)):  # Ω_v, Ω_q, Ω_k
            if np.shape(om) != (D // H, width):
                raise ValueError(f"head {h}: each map must be ({D // H} × {width}), got {np.shape(om)}")


def _combine(outs: list[np.ndarray], omega_c, D: int) -> np.ndarray:
    """Ω_c applied to the heads stacked vertically, head 1 on top."""
    stacked = np.concatenate(outs, axis=0)  # H × (D/H, N) -> (D, N)
    if np.shape(omega_c) != (D, stacked.shape[0]):
        raise ValueError(f"omega_c must be ({D} × {stacked.shape[0]}), got {np.shape(omega_c)}")
    return omega_c @ stacked  # (D, D)(D, N)


# ---------------------------------------------------------------------------------------------
# masked (causal) self-attention, §12.7, and cross-attention, §12.8


def causal_mask(N: int) -> np.ndarray:
    """The decoder's mask: ``M[m, n] = (m ≤ n)`` — query n may attend to keys 1..n only.

    Args:
        N: number of tokens.

    Returns:
        ``(N, N)`` boolean, indexed [key m, query n] like ``KᵀQ`` (upper triangle and diagonal).
    """
    if isinstance(N, bool) or not isinstance(N, (int, np.integer)) or N < 0:
        raise ValueError(f"N must be a non-negative int (the number of tokens), got {N!r}")
    m = np.arange(N)[:, None]  # key index down the rows
    n = np.arange(N)[None, :]  # query index along the columns
    return m <= n  # (N, N)


def _check_mask(mask, n_keys: int, n_queries: int, name: str = "mask") -> np.ndarray:
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise ValueError(f"{name} must be boolean (True = may attend), got dtype {mask.dtype}")
    if mask.shape != (n_keys, n_queries):
        raise ValueError(f"{name} must be (keys × queries) = ({n_keys} × {n_queries}), indexed [key m, "
                         f"query n], got shape {mask.shape}")
    return mask


def masked_softmax_cols(A: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Softmax of each column of ``A`` over the entries ``mask`` allows; the others are −∞.

    Args:
        A: ``(M, N)`` scores (keys × queries).
        mask: ``(M, N)`` boolean, True = may attend.

    Returns:
        ``(M, N)``: zero where masked; each column sums to one, or is all zeros when its whole
        column of ``mask`` is False (a query with no key to attend to).
    """
    A = np.asarray(A)
    if A.ndim != 2:
        raise ValueError(f"masked_softmax_cols expects a 2-D array (M×N), got shape {A.shape}")
    mask = _check_mask(mask, *A.shape)
    filled = np.where(mask, A, -np.inf)  # the book: masked dot products set to −∞
    out = np.zeros(A.shape, dtype=np.result_type(A, np.float64))
    live = mask.any(axis=0)  # columns with at least one key
    if live.any():
        out[:, live] = softmax_cols(filled[:, live])  # exp(−∞ − max) = 0 for the masked keys
    return out


def _allowed(N: int, causal: bool, mask) -> np.ndarray:
    """The ``(N, N)`` keys each query may attend to: causal ∧ mask."""
    allowed = causal_mask(N) if causal else np.ones((N, N), dtype=bool)
    if mask is not None:
        allowed = allowed & _check_mask(mask, N, N)
    return allowed


def masked_self_attention(X, omega_v, beta_v, omega_q, beta_q, omega_k, beta_k, scaled=False, *,
                          causal: bool = True, mask: np.ndarray | None = None):
    """Masked self-attention, the decoder's (the book's §12.7): Sa[X] = V · Softmax[Mask(KᵀQ)].

    The entries of ``KᵀQ`` that a query may not see are set to −∞ before the column softmax, so
    they get zero weight. With ``causal`` (the default) query n sees keys m ≤ n only: column n of
    the output depends on the tokens 1..n alone.

    Args:
        X: ``(D, N)`` input, one column per token.
        omega_v, omega_q, omega_k: ``(D_v, D)``, ``(D_q, D)``, ``(D_q, D)`` maps.
        beta_v, beta_q, beta_k: matching ``(rows, 1)`` biases.
        scaled: divide ``KᵀQ`` by ``√D_q``.
        causal: forbid key m for query n when m > n.
        mask: optional ``(N, N)`` boolean [key m, query n], True = may attend (e.g. a padding
            mask, ``pad[:, None]`` repeated over the queries); combined with ``causal``.

    Returns:
        ``(D_v, N)``; a column whose keys are all masked is zero.
    """
    V, Q, K = _qkv(X, omega_v, beta_v, omega_q, beta_q, omega_k, beta_k)
    N = Q.shape[1]
    scores = K.T @ Q  # (N, D_q)(D_q, N) -> (N keys, N queries)
    if scaled:
        scores = scores / np.sqrt(Q.shape[0])
    return V @ masked_softmax_cols(scores, _allowed(N, causal, mask))  # (D_v, N)(N, N) -> (D_v, N)


def masked_self_attention_per_token(X, omega_v, beta_v, omega_q, beta_q, omega_k, beta_k, scaled=False,
                                    *, causal: bool = True, mask: np.ndarray | None = None):
    """The per-token form of :func:`masked_self_attention`: sa_n = Σ_{m allowed} a[x_m, x_n] v_m.

    A deliberately literal double loop: for each query n, the softmax runs over the keys it may
    see (m ≤ n when causal, and ``mask[m, n]``) and the others are never visited; with none, sa_n
    is zero. It must equal :func:`masked_self_attention`.
    """
    _qkv(X, omega_v, beta_v, omega_q, beta_q, omega_k, beta_k)  # the shape checks only
    X = _tokens(X)
    N = X.shape[1]
    if mask is not None:
        mask = _check_mask(mask, N, N)
    bv, bq, bk = (np.asarray(b).reshape(-1) for b in (beta_v, beta_q, beta_k))
    v = [bv + omega_v @ X[:, m] for m in range(N)]  # v_m = β_v + Ω_v x_m
    q = [bq + omega_q @ X[:, n] for n in range(N)]
    k = [bk + omega_k @ X[:, m] for m in range(N)]
    d_q = np.shape(omega_q)[0]
    out = np.zeros((np.shape(omega_v)[0], N), dtype=np.result_type(X, omega_v))
    for n in range(N):
        # the keys query n sees: m ≤ n when causal, and those the mask allows
        keys = [m for m in range(N) if (m <= n or not causal) and (mask is None or mask[m, n])]
        if not keys:
            continue  # no key to attend to: sa_n = 0
        s = np.array([k[m] @ q[n] for m in keys])
        if scaled:
            s = s / np.sqrt(d_q)
        s = s - s.max()
        a = np.exp(s) / np.exp(s).sum()  # a[x_m, x_n] over the visible keys
        for weight, m in zip(a, keys):
            out[:, n] += weight * v[m]
    return out


def _cross_qkv(X_dec, X_enc, omega_v, beta_v, omega_q, beta_q, omega_k, beta_k):
    """Q from the decoder's tokens, K and V from the encoder's: (D_q,N_dec), (D_q,N_enc), (D_v,N_enc)."""
    X_dec = _tokens(X_dec, "X_dec", "D_dec", "N_dec")
    X_enc = _tokens(X_enc, "X_enc", "D_enc", "N_enc")
    _check_map("Q (from X_dec)", np.asarray(omega_q), np.asarray(beta_q), X_dec.shape[0])
    _check_map("K (from X_enc)", np.asarray(omega_k), np.asarray(beta_k), X_enc.shape[0])
    _check_map("V (from X_enc)", np.asarray(omega_v), np.asarray(beta_v), X_enc.shape[0])
    _check_rows_match(omega_q, omega_k)
    V = _linear_cols(X_enc, omega_v, beta_v)  # (D_v, N_enc)
    Q = _linear_cols(X_dec, omega_q, beta_q)  # (D_q, N_dec)
    K = _linear_cols(X_enc, omega_k, beta_k)  # (D_q, N_enc)
    return V, Q, K


def _enc_allowed(enc_mask, n_enc: int, n_dec: int) -> np.ndarray | None:
    """The encoder padding mask ``(N_enc,)`` repeated over the queries: ``(N_enc, N_dec)``."""
    if enc_mask is None:
        return None
    enc_mask = np.asarray(enc_mask)
    if enc_mask.dtype != np.bool_ or enc_mask.shape != (n_enc,):
        raise ValueError(f"enc_mask must be a boolean (N_enc,) = ({n_enc},) vector, True = real encoder "
                         f"token, got {enc_mask.dtype} of shape {enc_mask.shape}")
    return enc_mask[:, None] & np.ones((1, n_dec), dtype=bool)  # (N_enc,1)&(1,N_dec) -> (N_enc, N_dec)


def cross_attention(X_dec, X_enc, omega_v, beta_v, omega_q, beta_q, omega_k, beta_k, scaled=False, *,
                    enc_mask: np.ndarray | None = None):
    """Encoder–decoder (cross-) attention (the book's §12.8, Fig. 12.13): V · Softmax[KᵀQ].

    The queries come from the decoder, the keys and values from the encoder:
    Q = β_q 1ᵀ + Ω_q X_dec, K = β_k 1ᵀ + Ω_k X_enc, V = β_v 1ᵀ + Ω_v X_enc. The attention matrix
    ``Softmax[KᵀQ]`` is ``N_enc × N_dec``: one column per decoder token, a softmax over the
    encoder's tokens. No causal mask: every decoder token may see the whole input sequence.

    Args:
        X_dec: ``(D_dec, N_dec)`` decoder tokens (queries).
        X_enc: ``(D_enc, N_enc)`` encoder tokens (keys and values).
        omega_v, omega_q, omega_k: ``(D_v, D_enc)``, ``(D_q, D_dec)``, ``(D_q, D_enc)`` maps.
        beta_v, beta_q, beta_k: matching ``(rows, 1)`` biases.
        scaled: divide ``KᵀQ`` by ``√D_q``.
        enc_mask: optional ``(N_enc,)`` boolean, True = a real encoder token (False = padding,
            never attended to).

    Returns:
        ``(D_v, N_dec)``; every column is zero when ``enc_mask`` is all False.
    """
    V, Q, K = _cross_qkv(X_dec, X_enc, omega_v, beta_v, omega_q, beta_q, omega_k, beta_k)
    scores = K.T @ Q  # (N_enc, D_q)(D_q, N_dec) -> (N_enc keys, N_dec queries)
    if scaled:
        scores = scores / np.sqrt(Q.shape[0])
    allowed = _enc_allowed(enc_mask, K.shape[1], Q.shape[1])
    A = softmax_cols(scores) if allowed is None else masked_softmax_cols(scores, allowed)
    return V @ A  # (D_v, N_enc)(N_enc, N_dec) -> (D_v, N_dec)


def multihead_cross_attention(
    X_dec, X_enc, heads: Sequence[tuple[np.ndarray, ...]], omega_c: np.ndarray, *,
    enc_mask: np.ndarray | None = None,
) -> np.ndarray:
    """Multi-head cross-attention: Ω_c [Ca_1ᵀ, …, Ca_Hᵀ]ᵀ, each head a scaled :func:`cross_attention`.

    Args:
        X_dec: ``(D, N_dec)`` decoder tokens. X_enc: ``(D_enc, N_enc)`` encoder tokens.
        heads: H tuples ``(omega_v, beta_v, omega_q, beta_q, omega_k, beta_k)``: Ω_q ``(D/H, D)``,
            Ω_k and Ω_v ``(D/H, D_enc)``, biases ``(D/H, 1)``.
        omega_c: ``(D, D)`` output map on the heads stacked vertically (head 1 on top).
        enc_mask: optional ``(N_enc,)`` boolean encoder padding mask, True = real token.

    Returns:
        ``(D, N_dec)``. Every head is scaled by ``√(D/H)``.
    """
    X_dec = _tokens(X_dec, "X_dec", "D", "N_dec")
    X_enc = _tokens(X_enc, "X_enc", "D_enc", "N_enc")
    D = X_dec.shape[0]
    _check_heads(heads, D, D, X_enc.shape[0])
    outs = [cross_attention(X_dec, X_enc, *head, scaled=True, enc_mask=enc_mask) for head in heads]
    return _combine(outs, omega_c, D)  # H × (D/H, N_dec) -> (D, N_dec)
