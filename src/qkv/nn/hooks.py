"""Hook points: read or replace any intermediate of a qkv model by name while a ``with hooks(…)`` block runs.

Legend: B batch, T query length, S key length, H heads, G key/value heads, D head dim, C model width.

A name is a module's path in the model (``model.named_modules()``) and a point of that module:

* every attention module (``MultiHeadAttention``): ``q`` ``(B,H,T,D)`` the queries, after qk-norm
  and the position transform; ``k`` ``(B,G,S,D)`` the keys, likewise; ``v`` ``(B,G,S,D)`` the values;
  ``scores`` ``(B,H,T,S)`` similarity + score bias, masked entries −∞ (the mask is applied again
  after the hook); ``weights`` ``(B,H,T,S)`` the softmax of the scores, before dropout; ``heads``
  ``(B,H,T,D)`` each head's output, weights · V, before the heads are merged; ``out`` ``(B,T,C)`` the
  merged heads after the output map;
* every layer (``TransformerLayer``): ``resid_pre`` ``(B,T,C)`` its input; ``attn_out`` the attention
  sub-layer's output (after dropout); ``resid_mid`` the residual stream after the attention
  sub-layer (its norm included, post-LN); ``ffn_out`` the feed-forward sub-layer's output (after
  dropout); ``resid_post`` the layer's output.

e.g. ``"encoder.layers.3.attention.weights"`` in a masked LM, ``"layers.0.resid_mid"`` in an
:class:`~qkv.nn.encoder.Encoder`; :func:`hook_points` lists a model's names. TransformerLens' names
of the model's (first) stack of layers are accepted too — ``blocks.3.attn.hook_pattern``,
``blocks.0.hook_resid_post``, … (:data:`TRANSFORMER_LENS`) — with qkv's shapes (heads before
positions). Layers and heads are numbered from 0, as the module paths are.

A hook is ``fn(tensor, name) -> Tensor | None``: ``None`` leaves the tensor as it is (reading),
a tensor of the same shape replaces it (ablation, patching). It runs where the tensor is made, so
gradients flow through what it returns (:func:`torch.autograd.grad`).

**Cost when unused.** A module declares its points (``hook_points``); its ``forward`` checks one
module-level dict, :data:`TAPPED`, empty unless a block runs — one ``if``, no module attached, no
state kept on a module, the path layer → attention → plan → backend → kernel unchanged. Inside a
block only the modules named run their hooked path (this module): attention staged explicitly
(materialised scores; the numbers of :func:`~qkv.nn.stages.staged_attention`), a layer with its
residual sums written out (the same operations as its own path: bit for bit equal). The hooks
apply to the model object in every thread while the block runs; the padding-free path
(``forward_packed``) and incremental decoding (a KV cache) refuse hooked modules in one line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.nn.masks import key_padding_mask
from qkv.nn.stages import bias_rows, block_mask, expand_kv, masked_softmax, mix

__all__ = ["Hook", "ATTENTION_POINTS", "LAYER_POINTS", "TAPPED", "TRANSFORMER_LENS", "hooks", "hook_points",
           "resolve", "tapped_attention", "tapped_layer", "refuse_packed"]

#: ``fn(tensor, name) -> replacement or None``.
Hook = Callable[[Tensor, str], "Tensor | None"]

ATTENTION_POINTS = ("q", "k", "v", "scores", "weights", "heads", "out")
LAYER_POINTS = ("resid_pre", "attn_out", "resid_mid", "ffn_out", "resid_post")

#: id(module) → (the module, {point: (full name, hook)}) for the modules of the running blocks.
TAPPED: dict[int, tuple[nn.Module, dict[str, tuple[str, Hook]]]] = {}

#: TransformerLens' hook names (``blocks.{i}.…``) → qkv's point of layer i (or of its attention).
TRANSFORMER_LENS = {
    "hook_resid_pre": "resid_pre", "hook_attn_out": "attn_out", "hook_resid_mid": "resid_mid",
    "hook_mlp_out": "ffn_out", "hook_resid_post": "resid_post", "attn.hook_q": "attention.q",
    "attn.hook_k": "attention.k", "attn.hook_v": "attention.v", "attn.hook_attn_scores": "attention.scores",
    "attn.hook_pattern": "attention.weights", "attn.hook_z": "attention.heads",
}
_TL = re.compile(r"^blocks\.(\d+)\.(.+)$")


def _points_of(module: nn.Module) -> tuple[str, ...]:
    return getattr(type(module), "hook_points", ())


def hook_points(model: nn.Module) -> list[str]:
    """Every hook name of ``model``, in module order (see the module docstring)."""
    return [f"{path}.{p}" if path else p for path, m in model.named_modules() for p in _points_of(m)]


def _first_stack(model: nn.Module) -> str | None:
    """The path of the model's first ``layers`` list whose modules have layer hook points."""
    for path, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) and _points_of(m[0]) == LAYER_POINTS:
            return path
    return None


def _canonical(model: nn.Module, name: str) -> str:
    """A TransformerLens name as qkv's; any other name as it is."""
    found = _TL.match(name)
    if found is None or found.group(2) not in TRANSFORMER_LENS:
        return name
    stack = _first_stack(model)
    if stack is None:
        raise ValueError(f"hook {name!r}: a TransformerLens name needs a stack of transformer layers, and "
                         f"{type(model).__name__} has none")
    return f"{stack}.{found.group(1)}.{TRANSFORMER_LENS[found.group(2)]}".lstrip(".")


def resolve(model: nn.Module, table: Mapping[str, Hook]) -> dict[nn.Module, dict[str, tuple[str, Hook]]]:
    """``{module: {point: (name, hook)}}`` for the names of ``table``.

    Raises:
        ValueError: an unknown module path or point, or a hook that is not callable (one line naming
            it and how to list the names).
    """
    modules = dict(model.named_modules())
    out: dict[nn.Module, dict[str, tuple[str, Hook]]] = {}
    for given, fn in table.items():
        if not callable(fn):
            raise ValueError(f"hook for {given!r} must be a function fn(tensor, name), got {type(fn).__name__}")
        name = _canonical(model, given)
        path, _, point = name.rpartition(".")
        module = modules.get(path)
        if module is None or point not in _points_of(module):
            where = ("no module " + repr(path)) if module is None else \
                (f"{type(module).__name__} {path!r} has points {', '.join(_points_of(module)) or 'none'}")
            raise ValueError(f"unknown hook point {given!r} ({where}); names are a module path and a point, "
                             "e.g. 'layers.0.attention.weights' — qkv.nn.hooks.hook_points(model) lists them")
        out.setdefault(module, {})[point] = (given, fn)
    return out


@contextmanager
def hooks(model: nn.Module, table: Mapping[str, Hook]) -> Iterator[None]:
    """Run ``table``'s hooks whenever ``model`` computes inside the block.

    Args:
        model: any qkv model (or module holding qkv attention modules and layers).
        table: hook name → ``fn(tensor, name) -> Tensor | None`` (see the module docstring).

    Raises:
        ValueError: an unknown name, or a module already hooked by a running block.
    """
    resolved = resolve(model, table)
    busy = [points[next(iter(points))][0] for m, points in resolved.items() if id(m) in TAPPED]
    if busy:
        raise ValueError(f"hook {busy[0]!r}: its module is already hooked by a running `with hooks(...)` block; "
                         "give all its hooks to one block")
    for m, points in resolved.items():
        TAPPED[id(m)] = (m, points)
    try:
        yield
    finally:
        for m in resolved:
            TAPPED.pop(id(m), None)


def refuse_packed(module: nn.Module) -> None:
    """One line when a hooked module is run on the padding-free path."""
    raise ValueError(f"{type(module).__name__} has hooks attached; hooks run on the padded path: call the model "
                     "(forward) with an attention_mask instead of forward_packed")


def _tap(points: dict[str, tuple[str, Hook]], point: str, t: Tensor) -> Tensor:
    """``t``, or what the hook of ``point`` returns for it."""
    found = points.get(point)
    if found is None:
        return t
    name, fn = found
    new = fn(t, name)
    if new is None:
        return t
    if not isinstance(new, Tensor) or new.shape != t.shape:
        got = tuple(new.shape) if isinstance(new, Tensor) else type(new).__name__
        raise ValueError(f"hook {name!r} returned {got}; return None or a tensor of shape {tuple(t.shape)}")
    return new


def _scores(att: nn.Module, q: Tensor, k: Tensor) -> Tensor:
    """``(B,H,T,S)`` similarity of ``q (B,H,T,D)`` and ``k (B,H,S,D)`` as :func:`staged_attention` computes it
    (a dot product in float32 for half-precision queries)."""
    sim = att.similarity
    if q.dtype in (torch.float16, torch.bfloat16) and getattr(sim, "has_dot_form", False):
        qd, kd, scale = sim.as_dot(q, k)
        return (qd.float() * scale) @ kd.float().transpose(-2, -1)  # (B,H,T,D)(B,H,D,S) -> (B,H,T,S)
    return sim.scores(q, k)


def tapped_attention(att: nn.Module, x: Tensor, padding_mask: Tensor | None, *, context, causal: bool,
                     need_weights: bool, qk_pos: Tensor | None, cache) -> tuple[Tensor, Tensor | None]:
    """``MultiHeadAttention.forward`` with its hooks: ``(out (B,T,C), weights (B,H,T,S) or None)``."""
    points = TAPPED[id(att)][1]
    if cache is not None:
        raise ValueError("hooks do not run with a KV cache (incremental decoding); run the whole sequence "
                         "without cache=")
    B, T, _ = x.shape
    if att.cross or context is not None:
        q, k, v, mask = att.cross_inputs(x, context, padding_mask)
        bias, causal, window = None, False, None
    else:
        mask = None if padding_mask is None else key_padding_mask(padding_mask, batch=B, length=T)
        q, k, v = att.project(x, qk_pos)  # (B,H,T,D), 2 × (B,G,T,D)
        q, k, bias = att._positioned(q, k)
        window = att.window
    q, k, v = _tap(points, "q", q), _tap(points, "k", k), _tap(points, "v", v)
    H, S = q.shape[1], k.shape[2]
    keys, values = expand_kv(k, H), expand_kv(v, H)  # (B,G,S,D) -> (B,H,S,D)
    scores = _scores(att, q, keys)  # (B,H,T,S)
    if isinstance(bias, Tensor) and bias.dim() < 4:
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))  # left-pad to 4-D
    dense = bias_rows(bias, 0, T)  # (B?,H?,T,S) | None
    if dense is not None:
        scores = scores + dense.to(q.dtype).to(scores.dtype)
    m = block_mask(mask, causal, 0, T, T, S, q.device, window=window)  # (B?,H?,T,S) | None
    if m is not None:
        scores = scores.masked_fill(~m, float("-inf"))
    scores = _tap(points, "scores", scores)
    weights = masked_softmax(scores, m).to(q.dtype)  # (B,H,T,S)
    weights = _tap(points, "weights", weights)
    p = att.dropout if att.training else 0.0
    o = _tap(points, "heads", mix(F.dropout(weights, p) if p > 0 else weights, values))  # (B,H,T,D)
    out = _tap(points, "out", att._out(o))  # (B,H,T,D) -> (B,T,C)
    return out, weights if need_weights else None


def tapped_layer(layer: nn.Module, x: Tensor, padding_mask: Tensor | None, attend: dict) -> tuple[Tensor, Tensor | None]:
    """``TransformerLayer.forward`` with its hooks: ``(output (B,T,C), attention weights or None)``; the same
    operations as the layer's own path."""
    points = TAPPED[id(layer)][1]
    drop = layer.dropout
    x = _tap(points, "resid_pre", x)
    if layer.pre_norm:
        a = layer.attention(layer.norm1(x), padding_mask, **attend)
        h = _tap(points, "resid_mid", x + _tap(points, "attn_out", drop(a.output)))   # h = x + Att(Norm₁(x))
        f = _tap(points, "ffn_out", drop(layer.feed_forward(layer.norm2(h))))
        return _tap(points, "resid_post", h + f), a.weights                            # y = h + FFN(Norm₂(h))
    a = layer.attention(x, padding_mask, **attend)
    h = _tap(points, "resid_mid", layer.norm1(x + _tap(points, "attn_out", drop(a.output))))  # Norm₁(x + Att(x))
    f = _tap(points, "ffn_out", drop(layer.feed_forward(h)))
    return _tap(points, "resid_post", layer.norm2(h + f)), a.weights                   # y = Norm₂(h + FFN(h))
