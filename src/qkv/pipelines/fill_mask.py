"""``qkv.pipeline("fill-mask", model)``: a masked LM's most probable tokens for each mask token.

Legend: N tokens of a packed batch, M mask positions in it, C model width, V vocabulary.

Each text holds the model's own mask token (``[MASK]`` for BERT, ``<mask>`` for RoBERTa: its
tokenizer's ``mask`` role) once or more. The encoder runs on the texts packed back to back and the
masked-LM head only at the mask positions. What ``transformers``' fill-mask pipeline returns, per
text: a list of ``top_k`` dicts ``{"score", "token", "token_str", "sequence"}`` (a text with several
masks: one such list per mask; ``sequence`` then keeps the special tokens, as ``transformers`` does).
"""

from __future__ import annotations

import numpy as np
import torch

from qkv.models.mlm import MaskedLM
from qkv.pipelines.base import Pipeline, PipelineError

__all__ = ["FillMaskPipeline"]


class FillMaskPipeline(Pipeline):
    """Call options: ``top_k`` (default 5), ``truncation`` (cut a text longer than the window)."""

    task = "fill-mask"

    def check_model(self, model):
        if not isinstance(model, MaskedLM):
            raise PipelineError(f"fill-mask needs a masked language model (a qkv MaskedLM: a folder with a "
                                f"masked-LM head), got {type(model).__name__}")
        return model

    @property
    def mask_token(self) -> str:
        """The model's own mask token (``[MASK]``, ``<mask>``)."""
        token = self.tokenizer.specials.token("mask")
        if token is None:
            raise PipelineError(f"fill-mask: the tokenizer has no mask token ({self.tokenizer.specials.describe()})")
        return token

    def run(self, texts: list[str], *, top_k: int = 5, truncation: bool = False) -> list:
        mask, mask_id = self.mask_token, self.tokenizer.mask_id
        vocab = self.model.config.vocab_size
        if top_k > vocab:  # never silently fewer than asked for
            raise PipelineError(f"fill-mask: top_k={top_k:,} is above the model's vocabulary of {vocab:,} tokens; "
                                f"give at most {vocab:,}")
        sequences = self.encode_full(texts, truncation=truncation)
        for i, ids in enumerate(sequences):
            if not (ids == mask_id).any():
                raise PipelineError(f"fill-mask: text {i} has no {mask} (this model's mask token); write {mask} "
                                    "where a token is to be predicted")
        probs: list[torch.Tensor | None] = [None] * len(texts)
        head, decoder = self.model.head, self.model.decoder_weight
        for rows, packed in self.batches(sequences):
            h = self.model.encoder.forward_packed(packed).last_hidden_state  # (N,C)
            where = packed.input_ids == mask_id  # (N,)
            p = torch.softmax(head(h[where], decoder).float(), dim=-1)  # (M,C) -> (M,V)
            owner = packed.sequence_ids()[where].tolist()  # (M,) row of each mask within the batch
            for r in range(len(rows)):
                probs[int(rows[r])] = p[[j for j, o in enumerate(owner) if o == r]]  # (masks of r, V)
        return [self._records(ids, p, top_k) for ids, p in zip(sequences, probs)]

    def _records(self, ids: np.ndarray, probs: torch.Tensor, top_k: int) -> list:
        backend, pad = self.tokenizer.backend, self.tokenizer.specials.id("pad")
        where = np.flatnonzero(ids == self.tokenizer.mask_id)
        single = len(where) == 1
        out = []
        for k, pos in enumerate(where):
            values, tokens = probs[k].topk(min(int(top_k), probs.shape[-1]))
            rows = []
            for score, token in zip(values.tolist(), tokens.tolist()):
                filled = ids.copy()
                filled[pos] = token
                if pad is not None:
                    filled = filled[filled != pad]
                rows.append({"score": score, "token": token, "token_str": backend.decode([token]),
                             "sequence": backend.decode(filled.tolist(), skip_special_tokens=single)})
            out.append(rows)
        return out[0] if single else out
