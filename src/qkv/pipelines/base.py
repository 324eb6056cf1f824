"""What every pipeline shares: the model and tokenizer it runs, inputs in and out, padding-free batches.

Legend: B sequences in a batch, N their tokens back to back.

A pipeline holds a model in eval mode and its tokenizer. Its tokenizer is a copy in which every
special token of the tokenizer's roles (``[CLS]``, ``<mask>``, …; :mod:`qkv.data.special_tokens`) is
registered as special, as ``transformers``' tokenizers register them: a mask token written in a text
is read as the mask, and decoding can skip the special tokens (a BERT ``vocab.txt`` alone registers
none). Calls take one text (one result) or a list (a list of results); sequences run in batches of
similar length, packed back to back (:class:`~qkv.nn.packed.PackedBatch`): no padding is computed.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from tokenizers import AddedToken, Tokenizer

from qkv.checkpoints.bundled import model_folder
from qkv.checkpoints.io import Pretrained, load, unpack
from qkv.data.tokenizer_facade import TokenizerView, no_tokenizer
from qkv.data.windows import length_batches
from qkv.errors import QkvError
from qkv.nn.packed import PackedBatch

__all__ = ["PipelineError", "Pipeline", "resolve", "registered", "packed_batches"]


class PipelineError(QkvError, ValueError):
    """A pipeline that cannot run: a model of the wrong kind, an input it cannot take."""


def resolve(model, tokenizer=None, check=lambda model: model) -> Pretrained:
    """``(model, tokenizer)`` from a folder (or the short name of a bundled model, ``"minilm"``), what
    :func:`qkv.load` returns, or a model with ``tokenizer=``; ``check(model)`` runs before the tokenizer is
    asked for (a model of the wrong kind is named as such, not as one without a tokenizer).

    Raises:
        PipelineError: no tokenizer; CheckpointError: a folder that does not load.
    """
    folder = isinstance(model, (str, os.PathLike))
    if folder:
        model = load(model_folder(model))
    model, tokenizer = unpack(model, tokenizer)
    model = check(model)
    if tokenizer is None:  # the Python API's way out only where the Python API was used
        raise no_tokenizer("the model", error=PipelineError, hint="" if folder else ", or pass tokenizer= "
                           "(model, tokenizer = qkv.load(folder))")
    return Pretrained(model.eval(), tokenizer)


def registered(tokenizer) -> TokenizerView:
    """A :class:`TokenizerView` of ``tokenizer`` whose role tokens are all registered as special
    (see the module docstring); the caller's tokenizer is left as it is."""
    view = TokenizerView(tokenizer, error=PipelineError)
    backend: Tokenizer = view.backend
    known = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
    missing = [t for t in dict.fromkeys(view.specials.tokens.values()) if t not in known]
    if missing:
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])
    return view


def packed_batches(sequences: Sequence[np.ndarray], *, batch_size: int, batch_tokens: int | None,
                   device) -> Iterator[tuple[np.ndarray, PackedBatch]]:
    """``(rows, packed batch)``: the sequences in batches of similar length (at most ``batch_size``
    sequences and ``batch_tokens`` tokens), each packed back to back."""
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    for rows in length_batches(lengths, batch_size, batch_tokens):
        yield rows, PackedBatch.from_sequences([sequences[r] for r in rows], device=device)


class Pipeline(abc.ABC):
    """A model and its tokenizer, called on one input or a list (``transformers``' calling convention).

    Args:
        model: a folder, a short name, what :func:`qkv.load` returns, or a model (with ``tokenizer=``).
        tokenizer: replaces the bundle's.
        batch_size, batch_tokens: sequences and tokens per forward pass.
        device: where the model runs (``"cpu"``, ``"cuda"``, …).
        **defaults: call options every call gets (a call's own options win).

    Attributes:
        task: the task name. model: the model (eval mode). tokenizer: its view (see the module docstring).
    """

    task = ""

    def __init__(self, model, tokenizer=None, *, batch_size: int = 64, batch_tokens: int | None = 4096,
                 device: str = "cpu", **defaults: Any):
        model, tokenizer = resolve(model, tokenizer, self.check_model)
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.tokenizer = registered(tokenizer)
        self.batch_size, self.batch_tokens = int(batch_size), batch_tokens
        self.defaults = defaults

    def check_model(self, model):
        """The model this pipeline runs (raise :class:`PipelineError` for one of the wrong kind)."""
        return model

    def __call__(self, inputs, **options):
        single = isinstance(inputs, str)
        items = [inputs] if single else list(inputs)
        bad = [i for i, x in enumerate(items) if not isinstance(x, str)]
        if bad:
            raise PipelineError(f"{self.task}: input {bad[0]} is a {type(items[bad[0]]).__name__}; give a text "
                                "or a list of texts")
        with torch.inference_mode():
            results = self.run(items, **{**self.defaults, **options}) if items else []
        return results[0] if single else results

    @abc.abstractmethod
    def run(self, texts: list[str], **options) -> list:
        """The results of ``texts`` (one per text, in order) with the call's ``options``: the task's own
        (abstract: a subclass without it cannot be instantiated)."""

    def batches(self, sequences: Sequence[np.ndarray]) -> Iterator[tuple[np.ndarray, PackedBatch]]:
        return packed_batches(sequences, batch_size=self.batch_size, batch_tokens=self.batch_tokens,
                              device=self.device)

    def window(self) -> int:
        """The longest input the model takes (its position table)."""
        encoder = getattr(self.model, "encoder", self.model)
        return int(getattr(encoder, "max_len", None) or self.model.config.max_len)

    def encode_full(self, texts: list[str], *, truncation: bool = False) -> list[np.ndarray]:
        """Each text in the tokenizer's template, as one model input (``truncation``: cut to the window,
        else an error naming the text)."""
        view, limit = self.tokenizer, self.window()
        out = []
        for i, ids in enumerate(view.encode(texts)):
            room = limit - view.n_special
            if len(ids) > room:
                if not truncation:
                    raise PipelineError(f"{self.task}: text {i} has {len(ids) + view.n_special} tokens with its "
                                        f"special tokens, more than the model's window of {limit}; shorten it (in "
                                        "Python: pass truncation=True)")
                ids = ids[:room]
            out.append(np.asarray(view.frame(ids), dtype=np.int64))
        return out
