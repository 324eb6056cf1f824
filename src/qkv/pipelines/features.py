"""``qkv.pipeline("feature-extraction" | "text-generation", model)``.

Legend: N tokens of a packed batch, C model width.

**Feature extraction**: every token's last hidden state, the special tokens included, for each text
— what ``transformers``' feature-extraction pipeline returns: per text a nested list ``[[vector per
token]]`` (``1 × T × C``; ``return_tensors=True``: a ``(1,T,C)`` tensor). The encoder runs on the
texts packed back to back. (Document vectors, pooled and normalised over windows: :func:`qkv.embed`.)

**Text generation**: a causal LM continues each prompt (:func:`qkv.generation.prompts.generate_texts`:
greedy unless ``do_sample``; the KV cache; prompts of different lengths left-padded in one batch).
Per prompt: ``[{"generated_text": prompt + continuation}]`` (``return_full_text=False``: the
continuation alone), as ``transformers`` returns.
"""

from __future__ import annotations

import torch

from qkv.generation.prompts import generate_texts
from qkv.models.causal_lm import CausalLM
from qkv.models.kinds import encoder_of
from qkv.nn.encoder import Encoder
from qkv.pipelines.base import Pipeline, PipelineError

__all__ = ["FeatureExtractionPipeline", "TextGenerationPipeline"]


class FeatureExtractionPipeline(Pipeline):
    """Call options: ``return_tensors`` (``False``: nested lists), ``truncation`` (cut a text longer
    than the window)."""

    task = "feature-extraction"

    def check_model(self, model):
        try:
            encoder = encoder_of(model)
        except (ValueError, TypeError, AttributeError):
            encoder = None
        if not isinstance(encoder, Encoder):
            raise PipelineError(f"feature-extraction needs a model with a qkv encoder, got {type(model).__name__}")
        return encoder

    def run(self, texts: list[str], *, return_tensors: bool = False, truncation: bool = False) -> list:
        sequences = self.encode_full(texts, truncation=truncation)
        out: list = [None] * len(texts)
        for rows, packed in self.batches(sequences):
            h = self.model.forward_packed(packed).last_hidden_state.float()  # (N,C)
            for r, part in zip(rows, torch.split(h, list(packed.lengths))):  # (T_r,C) each
                out[int(r)] = part[None].cpu() if return_tensors else [part.tolist()]
        return out


class TextGenerationPipeline(Pipeline):
    """Call options: ``max_new_tokens`` (20), ``do_sample``, ``temperature``, ``top_k``, ``top_p``,
    ``seed``, ``return_full_text`` (True)."""

    task = "text-generation"

    def check_model(self, model):
        if not isinstance(model, CausalLM):
            raise PipelineError(f"text-generation needs a causal language model (a GPT-2 or qkv pretrain "
                                f"--objective clm folder), got {type(model).__name__}")
        return model

    def run(self, texts: list[str], *, return_full_text: bool = True, max_new_tokens: int = 20,
            **options) -> list:
        continuations = generate_texts(self.model, self.tokenizer.backend, texts, max_new_tokens=max_new_tokens,
                                       **options)
        return [[{"generated_text": (t + c) if return_full_text else c}] for t, c in zip(texts, continuations)]
