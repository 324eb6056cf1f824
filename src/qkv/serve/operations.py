"""What a batch of requests runs, per operation: embeddings, classification, fill-mask.

Each operation wraps the library's own entry point, so that the server answers exactly what the
Python API gives:

* :class:`EmbedOperation`: one :class:`~qkv.embeddings.embedder.Embedder` (windows for long texts,
  padding-free batches, the folder's pooling and normalisation) — the vectors of ``qkv.embed``;
* :class:`ClassifyOperation`: a :class:`~qkv.finetune.predict.Predictor` — what ``qkv predict`` gives;
* :class:`FillMaskOperation`: :func:`~qkv.analysis.fill_mask.fill_mask` on the masked LM.

``count(texts)`` gives each text's tokens (checked against the request limits before queueing);
``run(payloads)`` runs one batch of requests on the batching thread and returns one result per
request.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from qkv.analysis.fill_mask import FillMask, fill_mask, mask_token, masked_ids
from qkv.data.tokenizer import WordPieceTokenizer
from qkv.embeddings.embedder import Embedder
from qkv.embeddings.options import EmbedOptions
from qkv.finetune.predict import Predictor
from qkv.serve.errors import ApiError

__all__ = ["EmbedOperation", "ClassifyOperation", "FillMaskOperation", "split_back"]


def split_back(flat: list | np.ndarray, sizes: list[int]) -> list:
    """``flat`` results of the concatenated requests → one slice per request (``sizes`` texts each)."""
    out, start = [], 0
    for n in sizes:
        out.append(flat[start:start + n])
        start += n
    return out


class EmbedOperation:
    """``/v1/embeddings``: vectors as :func:`qkv.embed` gives them for the folder.

    Args:
        pretrained: the loaded model (an encoder or masked LM; :func:`qkv.load`).
        folder: its folder, whose declared pooling, normalisation and window apply (as for
            ``qkv.embed(folder, …)``).
        precision: ``"fp32"``, ``"bf16"`` or ``"int8"``.
        batch_tokens: tokens per forward pass.
    """

    name = "embeddings"

    def __init__(self, pretrained, folder: str | os.PathLike, *, precision: str, batch_tokens: int):
        model = pretrained.model
        encoder = getattr(model, "encoder", model)
        options = EmbedOptions(precision=precision, device="cpu", batch_tokens=batch_tokens)
        options = options.with_folder_defaults(folder, max_positions=encoder.max_len)
        self.embedder = Embedder(pretrained, options)
        self.dim = self.embedder.dim
        self.normalized = bool(self.embedder.normalize)

    def count(self, texts: list[str]) -> list[int]:
        """Tokens of each text with its special tokens (``[CLS]`` and ``[SEP]``)."""
        tok = self.embedder.tokenizer
        return [len(ids) + tok.n_special for ids in tok.encode(texts)]

    def warm_up(self) -> None:
        """Prepare the model for inference now rather than on the first request."""
        self.embedder.embed(["warm up"])

    def run(self, payloads: list[list[str]]) -> list[np.ndarray]:
        """Each request's texts → its ``(n,C)`` float32 vectors; all requests in one call."""
        vectors = self.embedder.embed([t for texts in payloads for t in texts])  # (N,C)
        return split_back(vectors, [len(texts) for texts in payloads])


class ClassifyOperation:
    """``/v1/classify``: labels and probabilities (a value; word tags) as ``qkv predict`` gives them.

    Args:
        folder: a fine-tuning run or any folder with a task head (its ``run.json`` settings apply).
        precision, batch_tokens: as for :class:`EmbedOperation`.
    """

    name = "classify"

    def __init__(self, folder: str | os.PathLike, *, precision: str, batch_tokens: int):
        self.predictor = Predictor(folder, device="cpu", precision=precision, batch_tokens=batch_tokens)
        self.task, self.labels = self.predictor.task, self.predictor.labels

    def count(self, texts: list[str]) -> list[int]:
        tok = self.predictor.tokenizer
        return [len(ids) + tok.n_special for ids in tok.encode(texts)]

    def warm_up(self) -> None:
        self.run([["warm up"]])

    def run(self, payloads: list[list[str]]) -> list[list[dict]]:
        """Each request's texts → one record per text (a token model reads each text's words, split at
        whitespace)."""
        texts = [t for batch in payloads for t in batch]
        inputs = [t.split() for t in texts] if self.task == "token-classification" else texts
        records = self.predictor.predict(inputs).records
        return split_back(records, [len(batch) for batch in payloads])


class FillMaskOperation:
    """``/v1/fill-mask``: a masked LM's most probable tokens for the one ``[MASK]`` of each text.

    Args:
        model: a :class:`~qkv.models.mlm.MaskedLM` (run as loaded, float32).
        tokenizer: its tokenizer (it needs pad, unk, cls, sep and mask tokens: ``[PAD] [UNK] [CLS] [SEP]
            [MASK]``, or RoBERTa's ``<pad> <unk> <s> </s> <mask>``).

    Raises:
        QkvError: the tokenizer lacks a special token fill-mask needs.
    """

    name = "fill-mask"

    def __init__(self, model, tokenizer):
        self.model = model
        self.tokenizer = WordPieceTokenizer(tokenizer)
        self.mask = mask_token(self.tokenizer)
        self.window = int(model.encoder.max_len)

    def count(self, texts: list[str], param: str = "input") -> list[int]:
        """Tokens of each text's model input; 400 for a text without exactly one mask token (``[MASK]``)
        or longer than the model's window."""
        counts, mask = [], self.mask
        for i, text in enumerate(texts):
            where = f"{param}[{i}]" if len(texts) > 1 else param
            if text.count(mask) != 1:
                raise ApiError(400, f"{where} has {text.count(mask)} {mask} tokens; fill-mask needs exactly one per "
                               "text", param=param, code="invalid_value")
            n = len(masked_ids(self.tokenizer, text)[0])
            if n > self.window:
                raise ApiError(400, f"{where} has {n} tokens with its special tokens, more than the model's window "
                               f"of {self.window}; shorten it around the {mask}", param=param,
                               code="context_length_exceeded")
            counts.append(n)
        return counts

    def run(self, payloads: list[tuple[list[str], int]]) -> list[list[FillMask]]:
        """Each request's ``(texts, k)`` → one :class:`~qkv.analysis.fill_mask.FillMask` per text with
        its ``k`` best tokens (the batch runs with the largest ``k`` and each request keeps its own)."""
        k = max(top_k for _, top_k in payloads)
        results = fill_mask(self.model, self.tokenizer, [t for texts, _ in payloads for t in texts], k=k)
        parts = split_back(results, [len(texts) for texts, _ in payloads])
        return [[dataclasses.replace(r, top=r.top[:top_k]) for r in part]
                for part, (_, top_k) in zip(parts, payloads)]
