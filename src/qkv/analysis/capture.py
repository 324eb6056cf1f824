"""Capture every layer's hidden states and every head's exact attention weights, batch by batch.

Legend: N contexts (model inputs), B contexts in a batch, T padded length, L layers, H heads,
C model width. Layer 0 of ``hidden_states`` is the embedding output.

Everything is read from the model's output dataclass (``hidden_states``, ``attentions``) — no hooks,
no state kept on modules. Memory is bounded by the batch: :func:`iter_captures` yields one
:class:`Capture` at a time and keeps nothing.

**Texts longer than the window.** A text is first tokenised without special tokens. If it has more
than the window holds beside the tokenizer's special tokens (``max_len - 2`` for ``[CLS] … [SEP]``
or ``<s> … </s>``), the policy ``long_text`` decides:

* ``"window"`` (the default for corpus analysis): split it into consecutive, non-overlapping windows
  of that many pieces (:func:`qkv.data.windows.make_windows` with ``cover_end=False``), each
  wrapped in the tokenizer's template (``[CLS] … [SEP]``) and analysed as its own context;
  document-level statistics (the label probe) average over all windows of the document.
  ``max_windows_per_doc`` keeps only the first windows of very long documents.
* ``"truncate"``: keep the first window only.
* ``"error"`` (the default for ``qkv inspect``): raise :class:`AnalysisInputError` naming the text,
  its length in pieces and the window.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from qkv.analysis.inputs import AnalysisInputError, tokenizer_view
from qkv.data.windows import length_batches, make_windows, pad_batch
from qkv.inference import for_inference_calibrated
from qkv.nn.encoder import Encoder
from qkv.nn.packed import PackedBatch
from qkv.models.kinds import encoder_of

__all__ = ["Contexts", "Capture", "model_window", "tokenize_corpus", "forward", "iter_captures", "in_precision"]

LONG_TEXT_POLICIES = ("window", "truncate", "error")


@dataclass
class Contexts:
    """A tokenised corpus: one entry per model input (window).

    Attributes:
        ids: N arrays ``(T_i,)`` of token ids, each ``prefix … suffix`` (``[CLS] … [SEP]``).
        whole_word: N boolean arrays ``(T_i,)``: the token is a complete word (False on specials).
        doc: ``(N,)`` index of the document each context comes from.
        n_docs: number of documents read (including any that gave no tokens).
        max_len: the window length used (including the special tokens).
        n_prefix, n_suffix: special tokens before and after each context's text (1 and 1 for
            ``[CLS] … [SEP]``).
    """

    ids: list[np.ndarray]
    whole_word: list[np.ndarray]
    doc: np.ndarray
    n_docs: int
    max_len: int
    n_prefix: int = 1
    n_suffix: int = 1

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self.ids], dtype=np.int64)  # (N,)


@dataclass
class Capture:
    """One batch of contexts with everything the model computed for it.

    Attributes:
        context: ``(B,)`` indices into :class:`Contexts`.
        input_ids: ``(B,T)`` token ids, padded with the pad id.
        mask: ``(B,T)`` True at real tokens.
        hidden_states: ``(L+1,B,T,C)`` float32; index 0 is the embedding output.
        attentions: ``(L,B,H,T,T)`` float32 exact attention weights (rows: queries, columns: keys),
            or ``None`` when not requested.
    """

    context: np.ndarray
    input_ids: np.ndarray
    mask: np.ndarray
    hidden_states: np.ndarray
    attentions: np.ndarray | None


def model_window(model) -> int | None:
    """The model's position-table size: qkv ``config.max_len`` / ``max_len``, or HF's name."""
    for obj in (getattr(model, "config", None), model, getattr(model, "encoder", None)):
        for name in ("max_len", "max_position_embeddings"):
            value = getattr(obj, name, None)
            if isinstance(value, int) and value > 0:
                return value
    return None


def _encoder_of(model):
    """A qkv model's stack of layers (no vocabulary projection needed): a masked LM's encoder, a
    causal LM's causal stack (``.decoder``, maps zero above the diagonal); any other model itself."""
    try:
        return encoder_of(model)
    except ValueError:  # not a qkv model (a Hugging Face one): itself
        return model


def in_precision(model, tokenizer, precision: str, max_len: int):
    """``model`` to run in ``precision``: itself for ``"fp32"``; for ``"bf16"``/``"int8"`` its qkv stack
    prepared by :func:`qkv.inference.for_inference` (int8: calibrated on the fixed calibration text
    in ``tokenizer``'s windows of ``max_len``).

    Raises:
        AnalysisInputError: a reduced precision for a model that is not qkv's.
        QkvError: a precision unknown or not offered on the model's device (one line saying why).
    """
    if precision == "fp32":
        return model
    stack = _encoder_of(model)
    if not _is_qkv_encoder(stack):
        raise AnalysisInputError(f"precision {precision!r} needs a qkv model, got {type(model).__name__}; load "
                                 "its folder with qkv.load (or pass the folder), or use precision 'fp32'")
    return for_inference_calibrated(stack, precision, tokenizer, max_len)


def tokenize_corpus(
    texts: Sequence[str],
    tokenizer,
    *,
    max_len: int,
    long_text: str = "window",
    max_windows_per_doc: int | None = None,
) -> Contexts:
    """Tokenise texts into model inputs of at most ``max_len`` tokens (see the module docstring).

    Raises:
        AnalysisInputError: an empty corpus, no tokens at all, a bad policy, or (with
            ``long_text="error"``) a text longer than the window.
    """
    if long_text not in LONG_TEXT_POLICIES:
        raise AnalysisInputError(f"long_text must be one of {LONG_TEXT_POLICIES}, got {long_text!r}")
    if len(texts) == 0:
        raise AnalysisInputError("the corpus is empty: no documents to analyse")
    tokenizer = tokenizer_view(tokenizer)
    if max_len < tokenizer.n_special + 1:
        raise AnalysisInputError(f"max_len must be at least {tokenizer.n_special + 1} (the tokenizer's "
                                 f"{tokenizer.n_special} special tokens and one token of text), got {max_len}")
    room = max_len - tokenizer.n_special
    encoded = tokenizer.encode_words(texts)
    if long_text == "error":
        for d, (text, (pieces, _)) in enumerate(zip(texts, encoded)):
            if len(pieces) > room:
                preview = text[:40].replace("\n", " ")
                raise AnalysisInputError(
                    f"text {d} ({preview!r}…) has {len(pieces)} word pieces, more than the window of "
                    f"{max_len} tokens allows ({room} + {tokenizer.n_special} special tokens); shorten it, or use "
                    f"long_text='truncate' or 'window'"
                )
    wins = make_windows([pieces for pieces, _ in encoded], window=max_len, cover_end=False, skip_empty=True,
                        truncate=long_text == "truncate", max_windows=max_windows_per_doc,
                        prefix=tokenizer.prefix, suffix=tokenizer.suffix)
    if not wins.ids:
        raise AnalysisInputError(f"the corpus of {len(texts)} documents gives no tokens at all")
    head, tail = [False] * len(tokenizer.prefix), [False] * len(tokenizer.suffix)
    whole = [np.array([*head, *encoded[d][1][a : a + room], *tail], dtype=bool)
             for d, a in zip(wins.doc, wins.start)]
    return Contexts(wins.ids, whole, np.array(wins.doc, dtype=np.int64), len(texts), max_len,
                    len(head), len(tail))


def forward(
    model,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
    *,
    attentions: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward pass; returns stacked hidden states and attention weights.

    A qkv model runs on the padding-free path (``Encoder.forward_packed``: no padded position is
    computed); any other model (``transformers``) on the padded batch with its mask.

    Args:
        input_ids: ``(B,T)`` int64, right-padded.
        mask: ``(B,T)`` bool, True at real tokens.
        token_type_ids: ``(B,T)`` int64 or ``None`` (the model's default: every token in segment 0;
            a model without segment embeddings, ``type_vocab_size=0``, accepts only ``None``).

    Returns:
        ``hidden (L+1,B,T,C)`` and ``attn (L,B,H,T,T)`` (``None`` if not requested), float32, zeros
        at padded positions on the packed path.
    """
    stack = _encoder_of(model)
    if _is_qkv_encoder(stack):
        return _forward_packed(stack, input_ids, mask, token_type_ids, attentions)
    with torch.inference_mode():
        out = stack(
            input_ids,
            attention_mask=mask,
            token_type_ids=token_type_ids,
            output_hidden_states=True,
            output_attentions=attentions,
        )
    hs = getattr(out, "hidden_states", None)
    if not hs:
        raise AnalysisInputError(
            f"the model's output ({type(out).__name__}) carries no hidden_states; "
            "it must return them when called with output_hidden_states=True"
        )
    hidden = torch.stack([h.float() for h in hs])  # L+1 × (B,T,C) -> (L+1,B,T,C)
    attn = None
    if attentions:
        at = getattr(out, "attentions", None)
        if not at:
            raise AnalysisInputError(
                f"the model's output ({type(out).__name__}) carries no attentions; "
                "it must return them when called with output_attentions=True"
            )
        attn = torch.stack([a.float() for a in at])  # L × (B,H,T,T) -> (L,B,H,T,T)
    return hidden, attn


def _is_qkv_encoder(stack) -> bool:
    return isinstance(stack, Encoder)


def _forward_packed(stack, input_ids, mask, token_type_ids, attentions):
    """:func:`forward` of a qkv stack on the padding-free path, results laid out as padded."""
    T = input_ids.shape[1]
    batch = PackedBatch.from_padded(input_ids, mask, token_type_ids)
    with torch.inference_mode():
        out = stack.forward_packed(batch, output_hidden_states=True, output_attentions=attentions)
        hidden = torch.stack([batch.unpack(h.float(), T) for h in out.hidden_states])  # L+1 × (N,C) -> (L+1,B,T,C)
        attn = None
        if attentions:
            attn = torch.stack([_pad_square(a.float(), T) for a in out.attentions])  # L × (B,H,t,t) -> (L,B,H,T,T)
    return hidden, attn


def _pad_square(weights: torch.Tensor, T: int) -> torch.Tensor:
    """``(B,H,t,t)`` → ``(B,H,T,T)`` with zeros beyond ``t`` (t, the longest sequence, may be < T)."""
    t = weights.shape[-1]
    return weights if t == T else torch.nn.functional.pad(weights, (0, T - t, 0, T - t))


def iter_captures(
    model, contexts: Contexts, *, batch_size: int = 16, pad_id: int = 0, attentions: bool = True
) -> Iterator[Capture]:
    """Run the model over all contexts in batches, yielding one :class:`Capture` per batch.

    Only one batch's tensors are alive at a time, so memory is bounded by ``batch_size`` ×
    ``max_len`` whatever the corpus size.
    """
    if batch_size < 1:
        raise AnalysisInputError(f"batch_size must be ≥ 1, got {batch_size}")
    window = model_window(model)
    if window is not None and contexts.max_len > window:
        raise AnalysisInputError(
            f"contexts of up to {contexts.max_len} tokens do not fit the model's window of {window}"
        )
    for idx in length_batches(contexts.lengths, batch_size):  # similar lengths: little padding
        input_ids, mask = pad_batch([contexts.ids[c] for c in idx], pad_id)  # (B,T) each
        hidden, attn = forward(model, torch.from_numpy(input_ids), torch.from_numpy(mask), attentions=attentions)
        yield Capture(
            context=idx,
            input_ids=input_ids,
            mask=mask,
            hidden_states=hidden.numpy(),
            attentions=None if attn is None else attn.numpy(),
        )
