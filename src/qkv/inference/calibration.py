"""Calibration for int8: the largest input each quantised linear map sees on a fixed set of texts.

Legend: I a map's input width, W window length.

int8 mode smooths each quantised map's input (see :mod:`qkv.nn.linear`); the smoothing
scales come from the largest absolute value of every input channel over calibration text. The
text is fixed and ships with Python: the standard library's ``pydoc`` help topics (English prose
and code), all but the first :data:`HELD_OUT` in sorted order — those are kept out so that tests can
measure int8 on text it was not calibrated on. :func:`calibration_sequences` tokenises them with a
model's tokenizer into windows; :func:`input_maxima` runs an encoder over them and records the
maxima; the result is deterministic for a model and tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn
from qkv.data.tokenizer_facade import TokenizerView
from qkv.data.windows import make_windows
from qkv.nn.packed import PackedBatch
from pydoc_data.topics import topics

__all__ = ["HELD_OUT", "calibration_texts", "calibration_sequences", "input_maxima"]

#: The first pydoc topics (sorted by name) left out of calibration.
HELD_OUT = 24
#: Longest calibration window.
_WINDOW = 256
#: Tokens per calibration forward pass.
_BATCH_TOKENS = 4096


def calibration_texts() -> list[str]:
    """The calibration texts: the pydoc topics after the first :data:`HELD_OUT`, in sorted order."""
    return [topics[k] for k in sorted(topics)][HELD_OUT:]


def calibration_sequences(tokenizer, max_len: int) -> list[np.ndarray]:
    """The calibration texts as ``[CLS] … [SEP]`` windows, the first window of each text, of at most
    ``min(max_len, 256)`` tokens (≈ 14,000 tokens: about a second of float32 compute for a MiniLM),
    for a :class:`~qkv.data.tokenizer_facade.TokenizerView` or any tokenizer one is made of (what
    :func:`qkv.load` returns, a ``tokenizers.Tokenizer``: its special tokens by role)."""
    if not isinstance(tokenizer, TokenizerView):
        tokenizer = TokenizerView(tokenizer)
    wins = make_windows(tokenizer.encode(calibration_texts()), window=min(int(max_len), _WINDOW),
                        truncate=True, prefix=tokenizer.prefix, suffix=tokenizer.suffix, skip_empty=True)
    return [np.asarray(w, dtype=np.int64) for w in wins.ids]


@torch.inference_mode()
def input_maxima(encoder: nn.Module, modules: Sequence[nn.Module], sequences: Sequence) -> list[Tensor]:
    """For each of ``modules`` (maps inside ``encoder``), ``(I,)``: the largest ``|x|`` of each input
    channel while ``encoder.forward_packed`` runs over ``sequences`` (token id sequences)."""
    if not sequences:
        raise ValueError("calibration needs at least one token sequence")
    maxima: list[Tensor | None] = [None] * len(modules)

    def hook(i):
        def record(_module, args):
            x = args[0].detach().float()
            m = x.reshape(-1, x.shape[-1]).abs().amax(dim=0)  # (…,I) -> (I,)
            maxima[i] = m if maxima[i] is None else torch.maximum(maxima[i], m)
        return record

    handles = [m.register_forward_pre_hook(hook(i)) for i, m in enumerate(modules)]
    try:
        first = next(iter(encoder.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
        batch: list = []
        tokens = 0
        for seq in list(sequences) + [None]:
            if seq is not None and (not batch or tokens + len(seq) <= _BATCH_TOKENS):
                batch.append(seq)
                tokens += len(seq)
                continue
            if batch:
                encoder.forward_packed(PackedBatch.from_sequences(batch, device=device))
            batch, tokens = ([seq], len(seq)) if seq is not None else ([], 0)
    finally:
        for h in handles:
            h.remove()
    return [m if m is not None else torch.zeros(mod.in_features) for m, mod in zip(maxima, modules)]
