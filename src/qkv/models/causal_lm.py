"""The causal language model: a decoder-only stack (every layer's attention causal) and an LM head
tied to the word embeddings.

Legend: B batch, T length, C model width, V vocabulary, N predicted positions in the batch.

The stack is an :class:`~qkv.nn.encoder.Encoder` built with ``causal=True``: query i attends to
keys 0 … i only (the textbook's masked self-attention, Prince §12.7). The head is GPT-2's:
``logits = h · Eᵀ`` with E the token embedding table (tied: one tensor, no copy, no bias); a
pre-LN stack normalises ``h`` first (its final norm, GPT-2's ``ln_f``). A model prepared for bf16 or
int8 inference multiplies by its own bfloat16 or int8 copy of E instead (``vocab_proj``, see
:meth:`qkv.nn.maps.LinearMaps.vocab_proj`); its logits are float32 all the same.

Next-token loss (Hugging Face's convention): ``labels`` has the shape of ``input_ids`` (usually
the ids themselves, :data:`IGNORE_INDEX` where not predicted, e.g. padding); position t's logits
are scored against ``labels[t + 1]``. Only the N scored positions go through the ``C × V`` head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from qkv.generation.loop import generate
from qkv.models.mlm import IGNORE_INDEX
from qkv.nn.encoder import Encoder
from qkv.nn.kv_cache import KVCache
from qkv.nn.maps import VOCAB_PROJ, tie_to_table

__all__ = ["CausalLM", "CausalLMOutput", "IGNORE_INDEX", "shift_labels"]


@dataclass
class CausalLMOutput:
    """Result of :class:`CausalLM`.

    Attributes:
        loss: mean next-token cross-entropy over the scored positions (scalar) when ``labels`` are
            given; NaN when none is scored.
        logits: without labels, ``(B,T,V)`` (row t predicts token t + 1); with labels, ``(N,V)``
            for the scored positions in row-major (batch, then position) order.
        last_hidden_state: ``(B,T,C)`` stack output (after the final norm, pre-LN).
        hidden_states: see :class:`qkv.nn.encoder.EncoderOutput`.
        attentions: see :class:`qkv.nn.encoder.EncoderOutput` (zero above the diagonal).
        cache: the :class:`~qkv.nn.kv_cache.KVCache` holding every position so far (with
            ``use_cache`` or ``cache=``), else ``None``.
    """

    loss: Tensor | None
    logits: Tensor
    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    cache: KVCache | None = None


def shift_labels(labels: Tensor) -> Tensor:
    """``(B,T)`` labels → ``(B,T)`` targets: position t gets ``labels[t + 1]``, the last -100."""
    targets = labels.new_full(labels.shape, IGNORE_INDEX)
    targets[:, :-1] = labels[:, 1:]
    return targets


class CausalLM(nn.Module):
    """A causal (decoder-only) stack + the tied LM head.

    Args:
        decoder: an :class:`~qkv.nn.encoder.Encoder` built with ``causal=True``.
        vocab_proj: the head's own ``C → V`` map of a model prepared for bf16 or int8 inference
            (:meth:`qkv.nn.maps.LinearMaps.vocab_proj`, filled from the token table when the state
            is loaded), or ``None``: the head multiplies by the table itself.
        config: the :class:`~qkv.config.ModelConfig` the model was built from (kept as
            ``.config``; saving and exporting read it), or ``None``.
    """

    def __init__(self, decoder: Encoder, *, vocab_proj: nn.Module | None = None, config=None):
        super().__init__()
        if not isinstance(decoder, Encoder) or not decoder.causal:
            raise ValueError("CausalLM needs a qkv Encoder built with causal=True "
                             "(qkv.models.builders.build_causal_lm makes one)")
        self.config = config
        self.decoder = decoder
        self.vocab_proj = vocab_proj
        if vocab_proj is not None:
            tie_to_table(self, "decoder.embeddings.tokens.weight", VOCAB_PROJ)

    @property
    def decoder_weight(self) -> Tensor:
        """``(V,C)`` — the token embedding table itself (tied)."""
        return self.decoder.embeddings.tokens.weight

    def logits(self, h: Tensor) -> Tensor:
        """``(…,C)`` hidden states → ``(…,V)`` next-token logits, float32."""
        if self.vocab_proj is not None:
            return self.vocab_proj(h).float()  # (…,C)(C,V) -> (…,V) in bf16 / int8, float32 out
        return F.linear(h, self.decoder_weight)  # (…,C)(C,V) -> (…,V)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        *,
        position_ids: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        cache: KVCache | None = None,
        use_cache: bool = False,
    ) -> CausalLMOutput:
        """Predict each next token.

        Args:
            input_ids: ``(B,T)`` token ids.
            attention_mask: ``(B,T)``, 1/True = real token (keys only are masked).
            labels: ``(B,T)`` ids to predict, :data:`IGNORE_INDEX` (-100) where not scored; row t's
                logits are scored against ``labels[t + 1]`` (pass ``input_ids``).
            position_ids: ``(B,T)`` positions for absolute encodings (a left-padded batch counts
                from each row's first real token); default ``0 … T-1``.
            output_hidden_states: also return every hidden state.
            output_attentions: also return every layer's attention weights.
            cache: a :class:`~qkv.nn.kv_cache.KVCache` of the P earlier positions: ``input_ids``
                are then the T new tokens and ``attention_mask`` is ``(B,P+T)`` (incremental
                decoding; see :meth:`qkv.nn.encoder.Encoder.forward`).
            use_cache: start a new cache when ``cache`` is ``None``, and return it.

        Returns:
            :class:`CausalLMOutput`.
        """
        if cache is None and use_cache:
            cache = KVCache(len(self.decoder.layers))
        if cache is None:
            out = self.decoder(input_ids, attention_mask, output_hidden_states=output_hidden_states,
                               output_attentions=output_attentions, position_ids=position_ids)
        else:
            out = self.decoder(input_ids, attention_mask, output_hidden_states=output_hidden_states,
                               output_attentions=output_attentions, position_ids=position_ids, cache=cache)
        h = out.last_hidden_state  # (B,T,C)
        loss = None
        if labels is None:
            logits = self.logits(h)  # (B,T,V)
        else:
            if tuple(labels.shape) != tuple(input_ids.shape):
                raise ValueError(f"labels must have the shape of input_ids {tuple(input_ids.shape)}, "
                                 f"got {tuple(labels.shape)}")
            flat = shift_labels(labels).reshape(-1)  # (B,T) -> (B·T,)
            picked = flat != IGNORE_INDEX  # (B·T,)
            logits = self.logits(h.reshape(-1, h.shape[-1])[picked])  # (B·T,C) -> (N,C) -> (N,V)
            loss = F.cross_entropy(logits, flat[picked])
        return CausalLMOutput(loss, logits, h, out.hidden_states, out.attentions, cache)

    def generate(self, input_ids: Tensor, **options) -> Tensor:
        """Continue each prompt: greedy or sampled decoding with a KV cache.

        Hugging Face's ``generate`` arguments (``attention_mask``, ``max_new_tokens``,
        ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``eos_token_id``, ``pad_token_id``)
        plus ``seed``, ``use_cache``, ``streamer`` and ``sliding``; see
        :func:`qkv.generation.generate`.

        Returns:
            ``(B, T + n)`` long: the prompts as given, then the new tokens.
        """
        return generate(self, input_ids, **options)
