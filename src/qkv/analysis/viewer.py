"""Inspect one text: every layer's attention — raw, value-norm weighted, rolled out, as flow — as heatmaps
(PNG and SVG) and an interactive offline HTML viewer, with what switching off each head does.

Legend: L layers, H heads, T tokens, C width. Layers and heads from 0 (``L0H3``, ``attention_layer_0.png``).

A text longer than the model's window is an error by default; ``long_text="truncate"`` keeps the
first window instead. The viewer stays usable at 512 tokens (matrix view, lines drawn for the hovered
token only above 64 tokens); attention flow is left out above ``flow_max_tokens`` (a note says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from qkv._fs import atomic_write_text
from qkv.analysis import plots
from qkv.analysis.capture import forward, model_window
from qkv.analysis.figures import ablation_figure, importance_figure, method_figure
from qkv.analysis.hooked import Batch
from qkv.analysis.inputs import AnalysisInputError, load_model, model_and_tokenizer, tokenizer_view
from qkv.analysis.inspect_methods import METHODS, ablation_scan, is_classifier, is_qkv, method_maps, token_importance
from qkv.analysis.parity import Parity, hf_parity
from qkv.analysis.seq2seq_inspect import inspect_seq2seq, output_folder, write_seq2seq_inspection
from qkv.analysis.viewer_html import render_viewer
from qkv.checkpoints.io import declared_kind, unpack
from qkv.data.tokenizer_facade import TokenizerView
from qkv.models.seq2seq import EncoderDecoder

__all__ = ["Inspection", "inspect_text", "write_inspection", "run_inspect"]


@dataclass
class Inspection:
    """One text through the model.

    Attributes:
        tokens: T token strings (with ``[CLS]`` / ``[SEP]``).
        input_ids, token_type_ids: ``(T,)``.
        attentions: ``(L,H,T,T)`` exact weights, rows = queries.
        hidden_states: ``(L+1,T,C)``, embeddings first.
        special: which tokens are ``[CLS]``, ``[SEP]`` or ``[PAD]``.
        maps: the other methods asked for (:mod:`qkv.analysis.inspect_methods`): ``value_norm``
            ``(L,H,T,T)``, ``rollout`` and ``flow`` ``(L,T,T)``.
        notes: why a method asked for is missing.
        ablation: ``(L,H)`` change of the output when each head is switched off, or ``None``;
            ablation_metric says what it measures.
        importance: a sequence classifier's token importance ``{method: (T,)}`` (empty otherwise);
            importance_target says what it is the importance to.
        parity: how far a converted Hugging Face model is from the original (:mod:`qkv.analysis.parity`).
    """

    text: str
    text_b: str | None
    tokens: list[str]
    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attentions: np.ndarray
    hidden_states: np.ndarray
    special: list[bool]
    maps: dict[str, np.ndarray] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    ablation: np.ndarray | None = None
    ablation_metric: str = ""
    importance: dict[str, np.ndarray] = field(default_factory=dict)
    importance_target: str = ""
    parity: Parity | None = None

    def batch(self) -> Batch:
        """The text as model input (segment ids only for a pair)."""
        ids = torch.from_numpy(self.input_ids)[None]  # (1,T)
        types = torch.from_numpy(self.token_type_ids)[None] if self.text_b is not None else None
        return Batch(ids, torch.ones_like(ids, dtype=torch.bool), types, (tuple(self.tokens),))


def _encode(tokenizer: TokenizerView, text: str, text_b: str | None, max_len: int, long_text: str):
    """``(ids, token types)`` of a text (or pair) in the tokenizer's template, cut to ``max_len`` with
    ``long_text="truncate"``."""
    a = tokenizer.encode([text])[0].tolist()
    b = tokenizer.encode([text_b])[0].tolist() if text_b is not None else None
    sp = tokenizer.specials
    n_special = len(tokenizer.prefix) + (len(sp.pair_middle) + len(sp.pair_suffix) if b is not None
                                         else len(tokenizer.suffix))
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
    ids = tokenizer.frame(a, b)
    first = len(tokenizer.prefix) + len(a) + (len(sp.pair_middle) if b is not None else len(tokenizer.suffix))
    types = [0] * first + [sp.pair_type] * (len(ids) - first)
    return np.array(ids, dtype=np.int64), np.array(types, dtype=np.int64)


def inspect_text(
    model,
    tokenizer,
    text: str,
    text_b: str | None = None,
    *,
    long_text: str = "error",
    max_len: int | None = None,
    methods: tuple[str, ...] = (),
    ablation: bool = False,
    flow_max_tokens: int = 48,
    importance: bool = False,
) -> Inspection:
    """Run one text (or a text pair, as ``[CLS] a [SEP] b [SEP]`` — the tokenizer's own template, e.g.
    RoBERTa's ``<s> a </s></s> b </s>``) and keep all attention maps.

    ``model`` and ``tokenizer`` as in :func:`qkv.analysis.analyze`.

    Args:
        methods: more views than the raw weights, among ``value_norm``, ``rollout``, ``flow``
            (:data:`~qkv.analysis.inspect_methods.METHODS`).
        ablation: also switch each head off alone and measure the change of the output (a qkv model).
        flow_max_tokens: attention flow only for texts of at most this many tokens.
        importance: for a qkv sequence classifier, each token's importance to the predicted class
            (:func:`~qkv.analysis.inspect_methods.token_importance`).

    Raises:
        AnalysisInputError: empty text; text longer than the window with ``long_text="error"``.
    """
    if long_text not in ("error", "truncate"):
        raise AnalysisInputError(f"long_text for inspect must be 'error' or 'truncate', got {long_text!r}")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise AnalysisInputError(f"unknown method {unknown[0]!r}; allowed: {', '.join(METHODS)}")
    model, tokenizer = unpack(model, tokenizer)  # a qkv.load bundle brings its tokenizer
    tokenizer = tokenizer_view(tokenizer)
    window = model_window(model) or 512
    max_len = min(max_len or window, window)
    ids, types = _encode(tokenizer, text, text_b, max_len, long_text)
    ids_t = torch.from_numpy(ids)[None]  # (1,T)
    hidden, attn = forward(model, ids_t, torch.ones_like(ids_t, dtype=torch.bool), torch.from_numpy(types)[None])
    special = [int(i) in tokenizer.specials.all_ids for i in ids]
    ins = Inspection(
        text=text,
        text_b=text_b,
        tokens=[tokenizer.id_to_token(i) for i in ids],
        input_ids=ids,
        token_type_ids=types,
        attentions=attn[:, 0].numpy(),  # (L,1,H,T,T) -> (L,H,T,T)
        hidden_states=hidden[:, 0].numpy(),  # (L+1,1,T,C) -> (L+1,T,C)
        special=special,
    )
    if methods:
        ins.maps, ins.notes = method_maps(model, ins.attentions, ins.batch(), methods, flow_max_tokens=flow_max_tokens)
    if importance and is_classifier(model) and tokenizer.unk_id is None:
        ins.notes.append("token importance: the tokenizer has no [UNK] to blank a token out with")
    elif importance and is_classifier(model):
        ins.importance, ins.importance_target = token_importance(
            model, ins.batch(), replacement_id=tokenizer.unk_id, maps=ins.maps)
    if ablation:
        if is_qkv(model):
            ins.ablation, ins.ablation_metric = ablation_scan(model, ins.batch())
        else:
            ins.notes.append("head ablation: needs a qkv model (load the folder with qkv.load)")
    return ins


def write_inspection(ins: Inspection, out_dir: str | Path, *, title: str = "",
                     formats: tuple[str, ...] = ("png",)) -> dict[str, Path]:
    """Write ``attention_layer_K.{png,svg}`` per layer (a grid of its heads, K from 0),
    ``attention_overview`` (layer × head), ``methods`` (the views per layer) and ``ablation`` when the
    inspection has them, and ``viewer.html``. Returns the paths by name (``layer_0``, ``overview``,
    …; an SVG's name ends in ``_svg``)."""
    out = output_folder(out_dir)
    paths: dict[str, Path] = {}

    def save(fig, name: str, stem: str) -> None:
        for fmt, path in plots.save_formats(fig, out / stem, formats, dpi=90).items():
            paths[name if fmt == formats[0] else f"{name}_{fmt}"] = path

    n_layers, n_heads, t, _ = ins.attentions.shape
    for layer in range(n_layers):
        save(plots.attention_grid(ins.attentions[layer], ins.tokens, layer), f"layer_{layer}", f"attention_layer_{layer}")
    save(plots.attention_overview(ins.attentions), "overview", "attention_overview")
    if ins.maps:
        save(method_figure(ins.tokens, {"raw": ins.attentions, **ins.maps}), "methods", "methods")
    if ins.ablation is not None:
        save(ablation_figure(ins.ablation, ins.ablation_metric), "ablation", "ablation")
    if ins.importance:
        save(importance_figure(ins.tokens, ins.importance, ins.importance_target), "importance", "importance")
    subtitle = f"{title + ' · ' if title else ''}{t} tokens · {n_layers} layers × {n_heads} heads"
    page = render_viewer(ins.tokens, ins.special, ins.attentions, title=f"qkv attention — {title}", subtitle=subtitle,
                         maps=ins.maps, notes=ins.notes, parity=None if ins.parity is None else ins.parity.describe(),
                         ablation=None if ins.ablation is None else (ins.ablation, ins.ablation_metric),
                         importance=(ins.importance, ins.importance_target) if ins.importance else None)
    paths["viewer"] = out / "viewer.html"
    atomic_write_text(paths["viewer"], page)
    return paths


def run_inspect(
    model_path,
    text: str,
    out_dir: str | Path,
    *,
    text_b: str | None = None,
    long_text: str = "error",
    methods: tuple[str, ...] = METHODS,
    ablation: bool = True,
    flow_max_tokens: int = 48,
    formats: tuple[str, ...] = ("png",),
    parity: bool = True,
    importance: bool = True,
):
    """Load a model folder (or take what :func:`qkv.load` returned), inspect ``text`` with every method and
    write the heatmaps and the viewer into ``out_dir``; for a Hugging Face folder, the parity report too.

    Returns:
        ``(Inspection, paths)`` (a :class:`~qkv.analysis.seq2seq_inspect.Seq2SeqInspection` for an
        encoder–decoder folder).
    """
    if not isinstance(model_path, (str, Path)) or not _is_seq2seq_folder(model_path):
        model, tokenizer, name = model_and_tokenizer(model_path)
    else:  # an encoder-decoder folder: its word-level tokenizer has no [CLS]/[SEP]
        (model, tokenizer), name = load_model(model_path), str(model_path)
    if isinstance(model, EncoderDecoder):
        ins = inspect_seq2seq(model, tokenizer, text)
        return ins, write_seq2seq_inspection(ins, out_dir, formats)
    ins = inspect_text(model, tokenizer, text, text_b, long_text=long_text, methods=methods, ablation=ablation,
                       flow_max_tokens=flow_max_tokens, importance=importance)
    if parity:
        ins.parity, why = hf_parity(model_path, model, ins.batch())
        if ins.parity is None and why != "not a Hugging Face folder":
            ins.notes.append(f"parity: no report ({why})")
    return ins, write_inspection(ins, out_dir, title=Path(name).name, formats=formats)


def _is_seq2seq_folder(path) -> bool:
    """Whether ``path`` is a qkv folder of kind ``encoder_decoder``."""
    return declared_kind(path) == "encoder_decoder"
