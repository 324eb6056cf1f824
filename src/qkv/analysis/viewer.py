"""Inspect one text: every layer's attention as PNG heatmaps and an interactive offline HTML viewer.

Legend: L layers, H heads, T tokens, C width.

A text longer than the model's window is an error by default (a viewer of hundreds of tokens is
unreadable); ``long_text="truncate"`` keeps the first window instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from qkv.analysis import plots
from qkv.analysis.capture import forward, model_window
from qkv.analysis.inputs import AnalysisInputError, tokenizer_view
from qkv.data.tokenizer_facade import TokenizerView
from qkv.analysis.viewer_html import render_viewer

__all__ = ["Inspection", "inspect_text", "write_inspection", "run_inspect"]


@dataclass
class Inspection:
    """One text through the model.

    Attributes:
        tokens: T token strings (with ``[CLS]`` / ``[SEP]``).
        input_ids, token_type_ids: ``(T,)``.
        attentions: ``(L,H,T,T)`` exact weights, rows = queries.
        hidden_states: ``(L+1,T,C)``, embeddings first.
    """

    text: str
    text_b: str | None
    tokens: list[str]
    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attentions: np.ndarray
    hidden_states: np.ndarray
    special: list[bool]


def _encode(tokenizer: TokenizerView, text: str, text_b: str | None, max_len: int, long_text: str):
    a = tokenizer.encode([text])[0].tolist()
    b = tokenizer.encode([text_b])[0].tolist() if text_b is not None else None
    n_special = 3 if b is not None else 2
    total = len(a) + (len(b) if b is not None else 0) + n_special
    if not a and not b:
        raise AnalysisInputError("the text is empty: it gives no tokens")
    if total > max_len:
        if long_text != "truncate":
            raise AnalysisInputError(
                f"the text has {total} tokens with its special tokens, more than the model's window of "
                f"{max_len}; shorten it or use long_text='truncate' (--truncate)"
            )
        room = max_len - n_special
        if b is not None:
            b = b[: max(room - len(a), room // 2)]
            a = a[: room - len(b)]
        else:
            a = a[:room]
    ids = [tokenizer.cls_id, *a, tokenizer.sep_id]
    types = [0] * len(ids)
    if b is not None:
        ids += [*b, tokenizer.sep_id]
        types += [1] * (len(b) + 1)
    return np.array(ids, dtype=np.int64), np.array(types, dtype=np.int64)


def inspect_text(
    model,
    tokenizer,
    text: str,
    text_b: str | None = None,
    *,
    long_text: str = "error",
    max_len: int | None = None,
) -> Inspection:
    """Run one text (or a text pair, as ``[CLS] a [SEP] b [SEP]``) and keep all attention maps.

    ``model`` and ``tokenizer`` as in :func:`qkv.analysis.analyze`.

    Raises:
        AnalysisInputError: empty text; text longer than the window with ``long_text="error"``.
    """
    if long_text not in ("error", "truncate"):
        raise AnalysisInputError(f"long_text for inspect must be 'error' or 'truncate', got {long_text!r}")
    from qkv.models.io import unpack

    model, tokenizer = unpack(model, tokenizer)  # a qkv.load bundle brings its tokenizer
    tokenizer = tokenizer_view(tokenizer)
    window = model_window(model) or 512
    max_len = min(max_len or window, window)
    ids, types = _encode(tokenizer, text, text_b, max_len, long_text)
    ids_t = torch.from_numpy(ids)[None]  # (1,T)
    hidden, attn = forward(model, ids_t, torch.ones_like(ids_t, dtype=torch.bool), torch.from_numpy(types)[None])
    special = [int(i) in (tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id) for i in ids]
    return Inspection(
        text=text,
        text_b=text_b,
        tokens=[tokenizer.id_to_token(i) for i in ids],
        input_ids=ids,
        token_type_ids=types,
        attentions=attn[:, 0].numpy(),  # (L,1,H,T,T) -> (L,H,T,T)
        hidden_states=hidden[:, 0].numpy(),  # (L+1,1,T,C) -> (L+1,T,C)
        special=special,
    )


def write_inspection(ins: Inspection, out_dir: str | Path, *, title: str = "") -> dict[str, Path]:
    """Write ``attention_layer_K.png`` per layer (a grid of its heads), ``attention_overview.png``
    (layer × head) and ``viewer.html``. Returns the paths by name."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"cannot create the output folder {str(out)!r}: {exc}") from exc
    paths: dict[str, Path] = {}
    n_layers, n_heads, t, _ = ins.attentions.shape
    for layer in range(n_layers):
        fig = plots.attention_grid(ins.attentions[layer], ins.tokens, layer)
        paths[f"layer_{layer + 1}"] = plots.save(fig, out / f"attention_layer_{layer + 1}.png", dpi=90)
    paths["overview"] = plots.save(plots.attention_overview(ins.attentions), out / "attention_overview.png", dpi=90)
    subtitle = f"{title + ' · ' if title else ''}{t} tokens · {n_layers} layers × {n_heads} heads"
    page = render_viewer(ins.tokens, ins.special, ins.attentions, title=f"qkv attention — {title}",
                         subtitle=subtitle)
    paths["viewer"] = out / "viewer.html"
    paths["viewer"].write_text(page, encoding="utf-8")
    return paths


def run_inspect(
    model_path,
    text: str,
    out_dir: str | Path,
    *,
    text_b: str | None = None,
    long_text: str = "error",
) -> tuple[Inspection, dict[str, Path]]:
    """Load a model folder (or take what :func:`qkv.load` returned), inspect ``text`` and write the
    heatmaps and the viewer into ``out_dir``."""
    from qkv.analysis.inputs import model_and_tokenizer

    model, tokenizer, name = model_and_tokenizer(model_path)
    ins = inspect_text(model, tokenizer, text, text_b, long_text=long_text)
    return ins, write_inspection(ins, out_dir, title=Path(name).name)
