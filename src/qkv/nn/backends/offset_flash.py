"""The offset-bias flash backend: relative, T5 and ALiBi biases on torch's fused flash kernel,
with a memory-efficient backward (learned-table gradient included).

Legend: B batch, H heads, T query length, S key length, D head dim, L = T+S-1 offsets, n table entries.

An :class:`~qkv.nn.offset_bias.OffsetBias` (``bias[h, i, j] = table[h, index[j - i + T - 1]]``)
never materialises the ``(H,T,S)`` tensor. On CPU with a dot-product similarity
:func:`offset_attention` runs it on ``_scaled_dot_product_flash_attention_for_cpu`` (memory linear
in T):

* **Hankel trick.** With the queries reversed (``i' = T-1-i``) the bias is a Hankel matrix
  ``bias[h, i', j] = values[h, i' + j]``: a strided *view* of the ``(H, L)`` per-offset vector
  (strides ``(L, 1, 1)``) that the kernel reads as its float ``attn_mask``. A key padding mask is
  honoured by calling the kernel on each run of valid keys (a view with an offset) and merging
  the runs by their log-sum-exp. The backward (q, k, v) is the kernel's backward on the same views.
* **Learned tables** need ``∂/∂table``: the sum of ``dS = P∘(dP - D)`` along each diagonal. With
  R the radius beyond which ``index`` is constant (:meth:`OffsetBias.radius`), the forward runs
  the left triangle ``d ≤ -R`` (constant bias) as a causal kernel call of its own and the rest in
  query blocks, and keeps the triangle's output and log-sum-exp. :mod:`qkv.nn.backends.offset_grad`
  then gets the triangle's sum from those, the band ``|d| < R`` by recomputing dS in small tiles,
  and ``d ≥ R`` from the rows of dS summing to zero.

Nothing of size ``(T,S)`` is kept between forward and backward: q, k, v, outputs and log-sum-exps
only. The backend's declaration (:attr:`OffsetFlashBackend.supports`) says when it applies (CPU, no dropout,
no causal mask, a mask over keys only, equal q and v head sizes, no sliding window); otherwise the chunked backend
runs the bias. Grouped-query keys and values (G < H heads) are expanded to H heads first (a copy).
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkv.nn.backends.base import AttendCall, Backend, Features, Supports
from qkv.nn.backends.offset_grad import table_grad
from qkv.nn.offset_bias import OffsetBias
from qkv.nn.stages import AttendOutput, expand_kv

__all__ = ["OffsetFlashBackend", "offset_attention"]

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
#: Queries per kernel call for the keys right of the left triangle (the split forward): at least
#: this many, and T/8 for long sequences (fewer, larger calls; measured on a 2-core EPYC).
REST_BLOCK = 256


def offset_attention(q: Tensor, k: Tensor, v: Tensor, *, similarity, bias: OffsetBias,
                     mask: Tensor | None = None, budget: int = 2**24) -> Tensor:
    """Attention with an offset bias on the flash kernel; see the module docstring.

    Args:
        q: ``(B,H,T,D)``. k: ``(B,H,S,D)``. v: ``(B,H,S,D)``.
        similarity: a similarity with a dot-product form (``as_dot``).
        bias: the :class:`OffsetBias`.
        mask: ``None`` or a boolean key mask broadcastable as ``(B?,1,1,S?)``; True = may attend.
            A query with no key gets zeros (and zero gradients).
        budget: elements of work memory for the band of the table gradient.

    Returns:
        ``(B,H,T,D)`` attended values.
    """
    B, S = q.shape[0], k.shape[2]
    if bias.q_len != q.shape[2] or bias.k_len != S or bias.n_heads not in (1, q.shape[1]):
        raise ValueError(
            f"offset bias is for (H,T,S) = ({bias.n_heads},{bias.q_len},{bias.k_len}); "
            f"attention has ({q.shape[1]},{q.shape[2]},{S})"
        )
    qd, kd, scale = similarity.as_dot(q, k)
    key_ok = None if mask is None else mask[:, 0, 0, :].expand(mask.shape[0], S)  # (B?,S)
    meta = (bias, float(scale), _key_groups(key_ok, B, S), key_ok, budget, bias.requires_grad)
    return _OffsetAttention.apply(qd, kd, v, bias.table, bias.index, meta)


def _key_groups(key_ok: Tensor | None, B: int, S: int):
    """Batch rows grouped by their runs of valid keys: ``[(rows, [(a, e), …]), …]``.

    ``rows`` is a slice when the group is the whole batch, else a long tensor of batch indices.
    """
    if key_ok is None or bool(key_ok.all()):
        return [(slice(0, B), [(0, S)])]
    ok = key_ok.to(torch.int8).cpu()
    edges = torch.diff(torch.nn.functional.pad(ok, (1, 1)), dim=1)  # (B?,S+1): +1 run start, -1 run end
    groups: dict[tuple, list[int]] = {}
    for b in range(ok.shape[0]):
        starts = (edges[b] == 1).nonzero().flatten().tolist()
        ends = (edges[b] == -1).nonzero().flatten().tolist()
        groups.setdefault(tuple(zip(starts, ends)), []).append(b)
    if ok.shape[0] == 1:
        ((runs, _),) = groups.items()
        return [(slice(0, B), list(runs))]
    out = []
    for runs, rows in groups.items():
        sel = slice(0, B) if len(rows) == B else torch.tensor(rows, device=key_ok.device)
        out.append((sel, list(runs)))
    return out


def _hankel(values: Tensor, rows: int, offset: int, keys: int) -> Tensor:
    """``(1,H,rows,keys)`` view with ``[0,h,r,κ] = values[h, offset + r + κ]``."""
    H, L = values.shape
    return values.as_strided((1, H, rows, keys), (0, L, 1, 1), values.storage_offset() + offset)


def _take(x: Tensor, rows) -> Tensor:
    return x[rows] if isinstance(rows, slice) else x.index_select(0, rows)


def _put(dst: Tensor, rows, src: Tensor) -> None:
    if isinstance(rows, slice):
        dst[rows] += src
    else:
        dst.index_add_(0, rows, src)


def _merge(o_acc: Tensor, l_acc: Tensor, o: Tensor, l: Tensor, first: bool = False) -> None:
    """In place: ``(o_acc, l_acc) ← softmax-merge of two partial attentions`` (-inf = empty).

    ``first``: the accumulator is still empty; just copy.
    """
    if first:
        o_acc.copy_(o)
        l_acc.copy_(l)
        return
    m = torch.logaddexp(l_acc, l)  # (…,T)
    m0 = torch.where(torch.isinf(m), 0.0, m)  # both empty: both weights exp(-inf) = 0
    w_acc, w = (l_acc - m0).exp().unsqueeze(-1), (l - m0).exp().unsqueeze(-1)  # (…,T,1)
    o_acc.mul_(w_acc.to(o_acc.dtype)).addcmul_(o, w.to(o.dtype))
    l_acc.copy_(m)


def _lse_dtype(x: Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype  # the kernel's


def _flash_runs(qf, k, v, values, scale, groups):
    """Kernel over reversed queries and all keys, run by run: ``(B,H,T,E)``, ``(B,H,T)`` reversed."""
    B, H, T, _ = qf.shape
    if len(groups) == 1 and isinstance(groups[0][0], slice) and len(groups[0][1]) == 1:
        ((a, e),) = groups[0][1]  # one run for the whole batch: no merging, no copies
        return _FLASH(qf, k[:, :, a:e], v[:, :, a:e], attn_mask=_hankel(values, T, a, e - a), scale=scale)
    out = qf.new_zeros(B, H, T, v.shape[-1])
    lse = torch.full((B, H, T), float("-inf"), dtype=_lse_dtype(qf))
    for rows, runs in groups:
        qg, kg, vg = _take(qf, rows), _take(k, rows), _take(v, rows)
        og = out.new_zeros(qg.shape[0], H, T, v.shape[-1])
        lg = lse.new_full((qg.shape[0], H, T), float("-inf"))
        for a, e in runs:
            _merge(og, lg, *_FLASH(qg, kg[:, :, a:e], vg[:, :, a:e], attn_mask=_hankel(values, T, a, e - a),
                                   scale=scale))
        out[rows], lse[rows] = og, lg  # rows without a valid key: output 0, lse -inf
    return out, lse


def _flash_split(q, qf, k, v, values, scale, groups, radius):
    """Left triangle ``d ≤ -R`` (causal calls) and the rest (query blocks), merged per row.

    Returns ``(out, lse)`` in query order and the triangle's partial attention
    ``(o_left, lse_left)`` of queries ``R … T-1`` (bias included; ``-inf`` = no key there).
    """
    B, H, T, _ = q.shape
    E, R = v.shape[-1], radius
    c_left = values[:, T - 1 - R].to(_lse_dtype(q))[:, None]  # (H,1) the constant bias of d ≤ -R
    rest = values.clone()
    rest[:, : T - R] = float("-inf")  # d ≤ -R belongs to the triangle
    step = max(REST_BLOCK, T // 8)
    blocks = [(st, min(T, st + step)) for st in range(0, T, step)][::-1]  # reversed rows ascending
    if len(groups) == 1 and groups[0][1] == [(0, T)] and k.shape[2] == T:  # no mask, self-attention
        o_left, lse_left = _FLASH(q[:, :, R:], k[:, :, : T - R], v[:, :, : T - R], is_causal=True,
                                  scale=scale)
        lse_left.add_(c_left)
        out = q.new_empty(B, H, T, E)
        lse = torch.empty(B, H, T, dtype=_lse_dtype(q))
        for st, sp in blocks:
            a = max(0, st - R + 1)  # keys left of a are all in the triangle for these queries
            o, l = _FLASH(qf[:, :, T - sp : T - st], k[:, :, a:], v[:, :, a:], scale=scale,
                          attn_mask=_hankel(rest, sp - st, T - sp + a, k.shape[2] - a))
            out[:, :, st:sp], lse[:, :, st:sp] = o.flip(2), l.flip(2)  # block-sized flips only
        _merge(out[:, :, R:], lse[:, :, R:], o_left, lse_left)
        return out, lse, o_left, lse_left
    out, o_left = q.new_zeros(B, H, T, E), q.new_zeros(B, H, T - R, E)
    lse = torch.full((B, H, T), float("-inf"), dtype=_lse_dtype(q))
    lse_left = lse.new_full((B, H, T - R), float("-inf"))
    for rows, runs in groups:
        whole = isinstance(rows, slice)
        qg, qfg, kg, vg = _take(q, rows), _take(qf, rows), _take(k, rows), _take(v, rows)
        og, olg, lg, llg = (out, o_left, lse, lse_left) if whole else (
            _take(out, rows), _take(o_left, rows), _take(lse, rows), _take(lse_left, rows))
        one = len(runs) == 1  # each query gets one part of each kind: copy, do not merge
        for a, e in runs:
            e_left = min(e, T - R)  # keys a … e_left-1 can be at d ≤ -R
            if a + R < T and a < e_left:  # query a+R+ρ sees key a+κ iff κ ≤ ρ: top-left causal
                o, l = _FLASH(qg[:, :, a + R :], kg[:, :, a:e_left], vg[:, :, a:e_left], is_causal=True,
                              scale=scale)
                _merge(olg[:, :, a:], llg[:, :, a:], o, l.add_(c_left), one)
            for st, sp in blocks:
                a2 = max(a, st - R + 1)
                if a2 >= e:
                    continue  # every query of the block has only triangle keys in this run
                mask = _hankel(rest, sp - st, T - sp + a2, e - a2)  # reversed rows T-sp … T-st-1
                o, l = _FLASH(qfg[:, :, T - sp : T - st], kg[:, :, a2:e], vg[:, :, a2:e], attn_mask=mask,
                              scale=scale)
                o, l = o.flip(2), l.flip(2)  # (B',H,sp-st,E) in query order
                dead = max(0, e + R - 1 - st)  # queries st+dead… have no key here: the kernel says lse 0
                o[:, :, dead:] = 0
                l[:, :, dead:] = float("-inf")
                _merge(og[:, :, st:sp], lg[:, :, st:sp], o, l, one)
        _merge(og[:, :, R:], lg[:, :, R:], olg, llg)  # queries < R have no triangle
        if not whole:
            out[rows], o_left[rows], lse[rows], lse_left[rows] = og, olg, lg, llg
    return out, lse, o_left, lse_left


def _flash_backward(go_f, qf, k, v, out_f, lse_f, values, scale, groups):
    """Gradients of q (reversed), k, v through the kernel, run by run."""
    T = qf.shape[2]
    if len(groups) == 1 and isinstance(groups[0][0], slice) and len(groups[0][1]) == 1:
        ((a, e),) = groups[0][1]
        gq, gk, gv = _FLASH_BWD(go_f, qf, k[:, :, a:e], v[:, :, a:e], out_f, lse_f, 0.0, False,
                                attn_mask=_hankel(values, T, a, e - a), scale=scale)
        if (a, e) == (0, k.shape[2]):
            return gq, gk, gv
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        dk[:, :, a:e], dv[:, :, a:e] = gk, gv
        return gq, dk, dv
    dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(k), torch.zeros_like(v)
    for rows, runs in groups:
        qg, kg, vg = _take(qf, rows), _take(k, rows), _take(v, rows)
        gg, og, lg = _take(go_f, rows), _take(out_f, rows), _take(lse_f, rows)
        for a, e in runs:
            gq, gk, gv = _FLASH_BWD(gg, qg, kg[:, :, a:e], vg[:, :, a:e], og, lg, 0.0, False,
                                    attn_mask=_hankel(values, T, a, e - a), scale=scale)
            _put(dq, rows, gq)
            _put(dk[:, :, a:e], rows, gk)
            _put(dv[:, :, a:e], rows, gv)
    return dq, dk, dv


class _OffsetAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, index, meta):
        bias, scale, groups = meta[:3]
        values = table[:, index].to(q.dtype).contiguous()  # (H,L)
        qf = q.flip(2)  # (B,H,T,D) copy, row i' = query T-1-i'
        radius = bias.radius() if meta[5] else None  # meta[5]: grad mode on and the table learned
        ctx.split = radius is not None and radius <= q.shape[2] - 1
        if ctx.split:  # the table gradient needs the left triangle's partial attention
            out, lse, o_left, lse_left = _flash_split(q, qf, k, v, values, scale, groups, radius)
            ctx.save_for_backward(q, qf, k, v, table, index, out, lse, o_left, lse_left)
        else:
            out_f, lse_f = _flash_runs(qf, k, v, values, scale, groups)
            out = out_f.flip(2)
            keep_q = q if meta[5] else None  # the band of the table gradient
            ctx.save_for_backward(keep_q, qf, k, v, table, index, out_f, lse_f, None, None)
        ctx.meta = meta
        return out

    @staticmethod
    def backward(ctx, go):
        q, qf, k, v, table, index, out, lse, o_left, lse_left = ctx.saved_tensors
        bias, scale, groups, key_ok, budget, _ = ctx.meta
        values = table[:, index].to(qf.dtype).contiguous()
        if ctx.split:
            out_f, lse_f = out.flip(2), lse.flip(2)
        else:  # saved reversed
            out_f, lse_f = out, lse
            out, lse = (out_f.flip(2), lse_f.flip(2)) if ctx.needs_input_grad[3] else (None, None)
        dq_f, dk, dv = _flash_backward(go.flip(2), qf, k, v, out_f, lse_f, values, scale, groups)
        del out_f, lse_f
        dtable = None
        if ctx.needs_input_grad[3]:
            dtable = table_grad(q=q, k=k, v=v, go=go, out=out, lse=lse, o_left=o_left, lse_left=lse_left,
                                values=values, table=table, index=index, radius=bias.radius(),
                                scale=scale, key_ok=key_ok, budget=budget)
        return dq_f.flip(2), dk, dv, dtable, None, None


class OffsetFlashBackend(Backend):
    """:func:`offset_attention` behind the backend interface."""

    supports = Supports(weights=False, offset_bias_only=True, dense_bias=False, causal=False, masks="keys",
                        dropout=False, grouped_kv=True, devices=("cpu",),
                        dtypes=tuple(str(d).removeprefix("torch.") for d in _FLASH_DTYPES), equal_head_dims=True,
                        memory="linear")
    stands_in_for = ("sdpa",)  # naming sdpa with an offset bias this kernel can run takes it (never a dense bias)

    def speed(self, f: Features) -> float:
        return 3.5 if f.small and f.learned_bias else 0.5  # a small learned table: the explicit path is faster

    def run(self, call: AttendCall) -> AttendOutput:
        H = call.q.shape[1]
        k, v = expand_kv(call.k, H), expand_kv(call.v, H)  # grouped-query k/v: (B,G,S,D) -> (B,H,S,D), a copy
        return AttendOutput(offset_attention(call.q, k, v, similarity=call.similarity, bias=call.bias,
                                             mask=call.mask, budget=call.budget))
