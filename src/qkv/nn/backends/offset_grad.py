"""Gradient of an offset bias table without a ``(T,S)`` tensor (used by :mod:`qkv.nn.backends.offset_flash`).

Legend: B batch, H heads, T query length, S key length, D head dim, E value head dim,
L = T+S-1 offsets, n table entries, t tile size.

For ``bias[h,i,j] = table[h, index[j-i+T-1]]`` the gradient of the table is the sum, over each
diagonal ``d = j - i``, of the score gradient ``dS = P∘(dP - D)`` (``P`` the attention weights,
``dP = dO·Vᵀ``, ``D_i = dO_i·O_i``), scattered by ``index``. With ``index`` constant for ``d ≤ -R``
and for ``d ≥ R`` (the radius R):

* **band** ``|d| < R`` — dS recomputed from the saved log-sum-exp in ``t×t`` tiles along the
  diagonal, summed per diagonal: ``O(T·R·D)`` work, ``O(budget)`` memory;
* **left triangle** ``d ≤ -R`` — from its partial attention ``(o_L, lse_L)`` kept by the forward:
  ``Σ dS = Σ_i w_i (dO_i·o_L,i - D_i)`` with ``w_i = exp(lse_L,i - lse_i)`` its share of the mass;
* **right triangle** ``d ≥ R`` — every row of dS sums to zero, so it is minus the two others.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["table_grad", "band_sums", "BAND_TILE"]

#: Queries (and keys) per tile when the band is recomputed.
BAND_TILE = 64


def table_grad(*, q, k, v, go, out, lse, o_left, lse_left, values, table, index, radius, scale,
               key_ok, budget) -> Tensor:
    """``(H, n)`` gradient of the table (see the module docstring).

    Args:
        q: ``(B,H,T,D)`` queries (dot form, unscaled). k: ``(B,H,S,D)``. v: ``(B,H,S,E)``.
        go: ``(B,H,T,E)`` output gradient. out: ``(B,H,T,E)`` output. lse: ``(B,H,T)`` log-sum-exp
            of the scores (``-inf`` for a query with no key).
        o_left, lse_left: ``(B,H,T-R,E)``, ``(B,H,T-R)`` partial attention of queries ``R…T-1``
            over ``d ≤ -R`` (bias included), or ``None`` when ``R > T-1`` (no such offset).
        values: ``(H, L)`` bias of each offset. table: ``(H, n)``. index: ``(L,)``.
        radius: R. scale: the score scale. key_ok: ``(B?, S)`` key mask or ``None``.
        budget: elements of work memory for the band.
    """
    T, S = q.shape[2], k.shape[2]
    work = torch.float32 if q.dtype in (torch.bfloat16, torch.float16) else q.dtype
    dvec = _rowdot(go.to(work), out.to(work))  # (B,H,T) D_i = dO_i·O_i
    gd = band_sums(q, k, v, go, lse, dvec, values.to(work), radius, scale, key_ok, budget, work)
    dtable = torch.zeros(table.shape, dtype=work, device=table.device).index_add_(1, index, gd)
    g_left = torch.zeros(table.shape[0], dtype=work, device=table.device)
    if radius <= T - 1:  # queries i ≥ R see keys j ≤ i - R, where the bias is constant
        m, R = lse[:, :, radius:].to(work), radius
        w = torch.where(torch.isinf(m), 0.0, (lse_left.to(work) - m.nan_to_num(0.0, 0.0, 0.0)).exp())
        dot = _rowdot(go[:, :, R:].to(work), o_left.to(work))  # (B,H,T-R) dO_i·o_L,i
        g_left = (w * (dot - dvec[:, :, R:])).sum((0, 2))  # (H,)
        dtable[:, int(index[T - 1 - radius])] += g_left
    if radius <= S - 1:  # d ≥ R: the rows of dS sum to zero
        dtable[:, int(index[T - 1 + radius])] -= gd.sum(1) + g_left
    return dtable.to(table.dtype)


def _rowdot(a: Tensor, b: Tensor) -> Tensor:
    """``(…,T,E)·(…,T,E) -> (…,T)`` without an elementwise product tensor (a batched GEMV)."""
    return torch.einsum("...te,...te->...t", a, b)


def _diag_sums(x: Tensor) -> Tensor:
    """``(H, t, w) -> (H, t + w - 1)``: sums along diagonals, entry ``c - r + t - 1``."""
    H, t, w = x.shape
    flat = x.new_zeros(H * t * (w + t))
    # row r of the skewed buffer holds x[r] shifted right by t-1-r: diagonals become columns
    flat.as_strided((H, t, w), (t * (w + t), w + t - 1, 1), t - 1).copy_(x)
    return flat.view(H, t, w + t).sum(1)[:, : t + w - 1]


def _tile_major(cols: list, n: int, t: int, fill: list, work) -> Tensor:
    """Stack ``(B,H,T,F)`` column blocks into a tile-major ``(n·B·H, t, ΣF)`` buffer.

    Rows ``T … n·t-1`` (padding up to whole tiles) get ``fill``, one scalar per block. Tile-major
    order makes tiles ``u0 … u1-1`` of every (batch, head) one contiguous batch for ``bmm``.
    """
    B, H, T = cols[0].shape[:3]
    widths = [c.shape[-1] for c in cols]
    buf = torch.empty(n, B, H, t, sum(widths), dtype=work, device=cols[0].device)
    view = buf.permute(1, 2, 0, 3, 4)  # (B,H,n,t,F) view of the tile-major buffer
    full, rem = divmod(T, t)
    lo = 0
    for c, w, f in zip(cols, widths, fill):
        dst = view[..., lo : lo + w]
        if full:
            dst[:, :, :full].copy_(c[:, :, : full * t].unflatten(2, (full, t)))  # (B,H,full,t,w)
        if rem:
            dst[:, :, full, :rem].copy_(c[:, :, full * t :])
            dst[:, :, full, rem:].fill_(f)
        lo += w
    return buf.view(n * B * H, t, -1)


def band_sums(q, k, v, go, lse, dvec, values, radius, scale, key_ok, budget, work) -> Tensor:
    """``(H, L)`` sums of dS along each diagonal ``|d| < R`` (zero elsewhere), in ``t×t`` tiles."""
    B, H, T, D = q.shape
    S, L, t = k.shape[2], q.shape[2] + k.shape[2] - 1, BAND_TILE
    nT, nS, BH = -(-T // t), -(-S // t), B * H
    neg = -torch.finfo(work).max / 16  # masked: sums of a few negs stay finite
    floor = math.log(torch.finfo(work).tiny) + 1  # exp() near or below tiny takes slow paths
    one = q.new_ones((), dtype=work).expand(B, H, max(T, S), 1)
    # s' = [q·scale, -lse, 1]·[k, 1, keymask]ᵀ = scale·qᵀk - lse (+neg for a masked key: P = 0)
    neg_lse = torch.where(torch.isfinite(lse), -lse.to(work), neg).unsqueeze(-1)  # no key: P = 0
    keymask = q.new_zeros((), dtype=work).expand(B, H, S, 1)
    if key_ok is not None:
        keymask = keymask.masked_fill(~key_ok[:, None, :, None], neg)
    qa = _tile_major([q, neg_lse, one[:, :, :T]], nT, t, [0.0, neg, 1.0], work)
    qa[..., :D] *= scale
    ka = _tile_major([k, one[:, :, :S], keymask], nS, t, [0.0, 1.0, neg], work)
    # dP' = [dO, -D]·[v, 1]ᵀ = dP - D
    ga = _tile_major([go, -dvec.unsqueeze(-1)], nT, t, [0.0, 0.0], work)
    va = _tile_major([v, one[:, :, :S]], nS, t, [0.0, 0.0], work)
    r = torch.arange(t, device=q.device)
    cmr = r[None, :] - r[:, None]  # (t,t) key column - query row
    chunk = max(1, budget // (2 * BH * t * t))  # tiles per matmul
    nb = min((radius + t - 2) // t, max(nT, nS))
    gd = torch.zeros(H, L, dtype=work, device=q.device)
    p_buf = q.new_empty(min(chunk, nT) * BH, t, t, dtype=work)  # reused: no fresh pages per tile run
    ds_buf = torch.empty_like(p_buf)
    for delta in range(-nb, nb + 1):  # key tile = query tile + delta
        u0, u1 = max(0, -delta), min(nT, nS - delta)
        d = delta * t + cmr  # (t,t) offsets in this tile pair
        ok = (d.abs() < radius) & (d >= -(T - 1)) & (d <= S - 1)
        if u1 <= u0 or not bool(ok.any()):
            continue
        bt = torch.where(ok, values[:, (d + T - 1).clamp(0, L - 1)], neg)  # (H,t,t); off the band: P = 0
        acc = torch.zeros(H, t, t, dtype=work, device=q.device)
        for c0 in range(u0, u1, chunk):
            c1 = min(u1, c0 + chunk)
            n, qs, ks = c1 - c0, slice(c0 * BH, c1 * BH), slice((c0 + delta) * BH, (c1 + delta) * BH)
            p = torch.bmm(qa[qs], ka[ks].transpose(1, 2), out=p_buf[: n * BH]).view(n, B, H, t, t)
            p.add_(bt).clamp_min_(floor).exp_()  # scale·qᵀk - lse + bias -> P (masked: e^floor, negligible)
            ds = torch.bmm(ga[qs], va[ks].transpose(1, 2), out=ds_buf[: n * BH]).view(n, B, H, t, t)  # dP - D
            ds.mul_(p)  # dS = P∘(dP - D)
            acc += ds.sum((0, 1))  # (H,t,t)
        lo = delta * t - (t - 1) + T - 1  # offset entry of diagonal c - r = -(t-1)
        m0, m1 = max(0, -lo), min(2 * t - 1, L - lo)
        gd[:, lo + m0 : lo + m1] += _diag_sums(acc)[:, m0:m1]
    return gd
