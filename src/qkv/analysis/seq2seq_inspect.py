"""Inspect one source through an encoder–decoder: greedy output, and the encoder, decoder and
cross-attention maps of every layer as heatmaps and in the interactive viewer page
(``viewer.html``, :mod:`qkv.analysis.viewer_html`) — ``qkv inspect`` on an encoder–decoder folder.

Legend: L layers, H heads, S source tokens, T target tokens. Layers and heads from 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from qkv._fs import atomic_write_text
from qkv.analysis import plots
from qkv.analysis.inputs import AnalysisInputError
from qkv.analysis.viewer_html import render_viewer
from qkv.checkpoints.io import unpack
from qkv.data.tokenizer_facade import as_backend

__all__ = ["Seq2SeqInspection", "inspect_seq2seq", "write_seq2seq_inspection", "output_folder"]


def output_folder(out_dir: str | Path) -> Path:
    """``out_dir``, created if needed (an ``OSError`` naming it when it cannot be)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"cannot create the output folder {str(out)!r}: {exc}") from exc
    return out


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
    """Encode ``text`` (whitespace-separated tokens of a word-level vocabulary, as the lab's tasks
    have; or any text with a subword translation vocabulary, :mod:`qkv.translation.subwords`:
    its pieces and ``[EOS]``), generate greedily, and keep the encoder, decoder and
    cross-attention maps of the generated target.

    Raises:
        AnalysisInputError: empty text, a token outside the vocabulary, a text longer than the window.
    """
    model, tokenizer = unpack(model, tokenizer)
    if tokenizer is None:
        raise AnalysisInputError("the encoder-decoder folder has no tokenizer.json; save the model with its tokenizer")
    tokenizer = as_backend(tokenizer, error=AnalysisInputError)  # a view of a Hugging Face folder's tokenizer too
    vocab = tokenizer.get_vocab()
    words = text.split()
    if not words:
        raise AnalysisInputError("the text is empty: it gives no tokens")
    eos = vocab.get("[EOS]", model.eos_token_id)  # a Marian folder's end token: its config's
    unknown = [w for w in words if w not in vocab]
    if unknown and type(tokenizer.model).__name__ != "WordLevel" and eos is not None:
        enc = tokenizer.encode(text, add_special_tokens=False)  # a subword (translation) vocabulary: its pieces and the end token
        words, token_ids = [*enc.tokens, "[EOS]"], [*enc.ids, eos]
    elif unknown:
        raise AnalysisInputError(f"token(s) {unknown[:3]} are not in the model's vocabulary; write the source as "
                                 "space-separated vocabulary tokens, e.g. '3 1 4 1 5'")
    else:
        token_ids = [vocab[w] for w in words]
    window = model.config.max_len if model.config is not None else 512
    if len(words) > window:
        raise AnalysisInputError(f"the text has {len(words)} tokens, more than the model's window of {window}")
    ids = torch.tensor([token_ids])  # (1,S)
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


def write_seq2seq_inspection(ins: Seq2SeqInspection, out_dir: str | Path, formats=("png",)) -> dict[str, Path]:
    """Write per layer ``cross_attention_layer_K.png`` (decoder × source, every head),
    ``decoder_attention_layer_K.png`` and ``encoder_attention_layer_K.png``, ``generated.txt``, and
    ``viewer.html`` (the three views per layer and head, target rows over source columns)."""
    out = output_folder(out_dir)
    paths: dict[str, Path] = {}
    rows = [f"{a}→{b}" for a, b in zip(ins.target_tokens, ins.output_tokens)]
    for layer in range(ins.cross_attentions.shape[0]):
        for name, attn, q, k in (("cross", ins.cross_attentions, rows, ins.source_tokens),
                                 ("decoder", ins.decoder_attentions, rows, ins.target_tokens),
                                 ("encoder", ins.encoder_attentions, ins.source_tokens, ins.source_tokens)):
            kind = {"cross": "cross-attention (decoder × source)", "decoder": "decoder self-attention (causal)",
                    "encoder": "encoder self-attention"}[name]
            fig = plots.attention_grid(attn[layer], q, layer, key_tokens=k, kind=kind)
            for fmt, path in plots.save_formats(fig, out / f"{name}_attention_layer_{layer}", formats, dpi=90).items():
                paths[f"{name}_{layer}" + ("" if fmt == "png" else f"_{fmt}")] = path
    paths["generated"] = out / "generated.txt"
    atomic_write_text(paths["generated"], " ".join(t for t in ins.output_tokens if t != "[PAD]") + "\n")
    paths["viewer"] = out / "viewer.html"
    atomic_write_text(paths["viewer"], seq2seq_viewer(ins, rows))
    return paths


def _special(tokens: list[str]) -> list[bool]:
    return [t.startswith("[") and t.endswith("]") for t in tokens]


def seq2seq_viewer(ins: Seq2SeqInspection, rows: list[str]) -> str:
    """The viewer page of ``ins``: views ``cross`` (rows: ``rows``, one per decoder position, over the
    source tokens), ``decoder`` (rows over the target tokens) and ``encoder`` (source × source)."""
    L, H, T, S = ins.cross_attentions.shape
    source = (ins.source_tokens, _special(ins.source_tokens))
    target = (ins.target_tokens, _special(ins.target_tokens))
    queries = (rows, _special(ins.target_tokens))
    output = " ".join(t for t in ins.output_tokens if t != "[PAD]")
    return render_viewer(ins.target_tokens, target[1], None, title=f"qkv attention — translation of {ins.text!r}",
                         subtitle=f"{S} source tokens → {T} target tokens · {L} layers × {H} heads",
                         maps={"cross": ins.cross_attentions, "decoder": ins.decoder_attentions,
                               "encoder": ins.encoder_attentions},
                         axes={"cross": {"queries": queries, "keys": source}, "decoder": {"queries": queries},
                               "encoder": {"queries": source, "keys": source}},
                         notes=[f"source: {' '.join(ins.source_tokens)}", f"output (greedy): {output}",
                                "rows of the cross and decoder views: a decoder input → the token it predicts"])
