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
from qkv.checkpoints.io import unpack
from qkv.analysis.inputs import model_and_tokenizer
from qkv.models.seq2seq import EncoderDecoder
import json
from qkv.analysis.inputs import load_model

__all__ = ["Inspection", "inspect_text", "write_inspection", "run_inspect", "Seq2SeqInspection", "inspect_seq2seq",
           "write_seq2seq_inspection"]


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
) -> Inspection:
    """Run one text (or a text pair, as ``[CLS] a [SEP] b [SEP]`` — the tokenizer's own template, e.g.
    RoBERTa's ``<s> a </s></s> b </s>``) and keep all attention maps.

    ``model`` and ``tokenizer`` as in :func:`qkv.analysis.analyze`.

    Raises:
        AnalysisInputError: empty text; text longer than the window with ``long_text="error"``.
    """
    if long_text not in ("error", "truncate"):
        raise AnalysisInputError(f"long_text for inspect must be 'error' or 'truncate', got {long_text!r}")
    model, tokenizer = unpack(model, tokenizer)  # a qkv.load bundle brings its tokenizer
    tokenizer = tokenizer_view(tokenizer)
    window = model_window(model) or 512
    max_len = min(max_len or window, window)
    ids, types = _encode(tokenizer, text, text_b, max_len, long_text)
    ids_t = torch.from_numpy(ids)[None]  # (1,T)
    hidden, attn = forward(model, ids_t, torch.ones_like(ids_t, dtype=torch.bool), torch.from_numpy(types)[None])
    special = [int(i) in tokenizer.specials.all_ids for i in ids]
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


def _output_folder(out_dir: str | Path) -> Path:
    """``out_dir``, created if needed (an ``OSError`` naming it when it cannot be)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"cannot create the output folder {str(out)!r}: {exc}") from exc
    return out


def write_inspection(ins: Inspection, out_dir: str | Path, *, title: str = "") -> dict[str, Path]:
    """Write ``attention_layer_K.png`` per layer (a grid of its heads), ``attention_overview.png``
    (layer × head) and ``viewer.html``. Returns the paths by name."""
    out = _output_folder(out_dir)
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


@dataclass
class Seq2SeqInspection:
    """One source through an encoder–decoder, decoded greedily (L layers, H heads, S source, T target).

    Attributes:
        source_tokens: S source tokens. target_tokens: T decoder inputs (the start token, then the
            generated tokens); row t predicts ``output_tokens[t]``. output_tokens: T generated tokens.
        encoder_attentions: ``(L,H,S,S)``. decoder_attentions: ``(L,H,T,T)`` (causal).
        cross_attentions: ``(L,H,T,S)``: each decoder position over the source.
    """

    text: str
    source_tokens: list[str]
    target_tokens: list[str]
    output_tokens: list[str]
    encoder_attentions: np.ndarray
    decoder_attentions: np.ndarray
    cross_attentions: np.ndarray

    @property
    def attentions(self) -> np.ndarray:
        """The decoder's self-attention (what the CLI counts layers and heads of)."""
        return self.decoder_attentions


@torch.no_grad()
def inspect_seq2seq(model, tokenizer, text: str, *, max_new_tokens: int | None = None) -> Seq2SeqInspection:
    """Encode ``text`` (whitespace-separated tokens of the model's tokenizer), generate greedily,
    and keep the encoder, decoder and cross-attention maps of the generated target.

    Raises:
        AnalysisInputError: empty text, a token outside the vocabulary, a text longer than the window.
    """
    model, tokenizer = unpack(model, tokenizer)
    if tokenizer is None:
        raise AnalysisInputError("the encoder-decoder folder has no tokenizer.json; save the model with its tokenizer")
    vocab = tokenizer.get_vocab()
    words = text.split()
    if not words:
        raise AnalysisInputError("the text is empty: it gives no tokens")
    unknown = [w for w in words if w not in vocab]
    if unknown:
        raise AnalysisInputError(f"token(s) {unknown[:3]} are not in the model's vocabulary; write the source as "
                                 "space-separated vocabulary tokens, e.g. '3 1 4 1 5'")
    window = model.config.max_len if model.config is not None else 512
    if len(words) > window:
        raise AnalysisInputError(f"the text has {len(words)} tokens, more than the model's window of {window}")
    ids = torch.tensor([[vocab[w] for w in words]])  # (1,S)
    eos = vocab.get("[EOS]")
    out = model.generate(ids, max_new_tokens=max_new_tokens or min(window - 1, 2 * len(words) + 2),
                         eos_token_id=eos)  # (1,1+n)
    dec_in = out[:, :-1] if out.shape[1] > 1 else out  # (1,T): row t predicts out[t+1]
    res = model(ids, decoder_input_ids=dec_in, output_attentions=True)
    inverse = {i: w for w, i in vocab.items()}
    stack = lambda maps: torch.stack(maps)[:, 0].numpy()  # noqa: E731  L × (1,H,·,·) -> (L,H,·,·)
    return Seq2SeqInspection(
        text=text, source_tokens=words, target_tokens=[inverse[int(i)] for i in dec_in[0]],
        output_tokens=[inverse[int(i)] for i in out[0, 1:]], encoder_attentions=stack(res.encoder_attentions),
        decoder_attentions=stack(res.decoder_attentions), cross_attentions=stack(res.cross_attentions))


def write_seq2seq_inspection(ins: Seq2SeqInspection, out_dir: str | Path) -> dict[str, Path]:
    """Write per layer ``cross_attention_layer_K.png`` (decoder × source, every head),
    ``decoder_attention_layer_K.png`` and ``encoder_attention_layer_K.png``, and ``generated.txt``."""
    out = _output_folder(out_dir)
    paths: dict[str, Path] = {}
    for layer in range(ins.cross_attentions.shape[0]):
        rows = [f"{a}→{b}" for a, b in zip(ins.target_tokens, ins.output_tokens)]
        for name, attn, q, k in (("cross", ins.cross_attentions, rows, ins.source_tokens),
                                 ("decoder", ins.decoder_attentions, rows, ins.target_tokens),
                                 ("encoder", ins.encoder_attentions, ins.source_tokens, ins.source_tokens)):
            kind = {"cross": "cross-attention (decoder × source)", "decoder": "decoder self-attention (causal)",
                    "encoder": "encoder self-attention"}[name]
            fig = plots.attention_grid(attn[layer], q, layer, key_tokens=k, kind=kind)
            paths[f"{name}_{layer + 1}"] = plots.save(fig, out / f"{name}_attention_layer_{layer + 1}.png", dpi=90)
    paths["generated"] = out / "generated.txt"
    paths["generated"].write_text(" ".join(t for t in ins.output_tokens if t != "[PAD]") + "\n", encoding="utf-8")
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
    if not isinstance(model_path, (str, Path)) or not _is_seq2seq_folder(model_path):
        model, tokenizer, name = model_and_tokenizer(model_path)
    else:  # an encoder-decoder folder: its word-level tokenizer has no [CLS]/[SEP]
        (model, tokenizer), name = load_model(model_path), str(model_path)
    if isinstance(model, EncoderDecoder):
        ins = inspect_seq2seq(model, tokenizer, text)
        return ins, write_seq2seq_inspection(ins, out_dir)
    ins = inspect_text(model, tokenizer, text, text_b, long_text=long_text)
    return ins, write_inspection(ins, out_dir, title=Path(name).name)


def _is_seq2seq_folder(path) -> bool:
    """Whether ``path`` is a qkv folder of kind ``encoder_decoder``."""
    try:
        return json.loads((Path(path) / "qkv.json").read_text(encoding="utf-8")).get("kind") == "encoder_decoder"
    except (OSError, ValueError, AttributeError):
        return False
