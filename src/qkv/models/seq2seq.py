"""The encoder–decoder (Prince §12.8): a bidirectional encoder reads the source once; a decoder
generates the target, each layer attending causally to the target so far and, through
cross-attention, to the encoder's output.

Legend: B batch, S source length, T target length, C model width, V vocabulary.

* the encoder is an :class:`~qkv.nn.encoder.Encoder` (bidirectional);
* the decoder (:class:`Decoder`) embeds the target with the encoder's token table (one shared
  vocabulary: one tensor, saved once) or with a table of its own (separate vocabularies), adds its
  own positions, runs :class:`~qkv.nn.decoder_layer.DecoderLayer` s, and a final norm (pre-LN);
  over a :class:`~qkv.nn.kv_cache.KVCache` it runs only the new tokens (incremental decoding);
* the LM head is tied to the decoder's token table: ``logits = (s·h) Eᵀ + b`` with ``s`` the
  output scale (1; T5: C^-½) and ``b`` a fixed logits bias (none; Marian's and BART's
  ``final_logits_bias``).

Decoding (greedy, beam search, sampling) lives in :mod:`qkv.generation.seq2seq`.

Loss (the T5/BART convention of Hugging Face): ``labels (B,T)``, -100 where not scored; without
``decoder_input_ids`` the decoder reads ``labels`` shifted right behind the decoder start token
(:func:`shift_right`), so position t predicts ``labels[t]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.generation.seq2seq import generate_seq2seq
from qkv.models.mlm import IGNORE_INDEX
from qkv.nn.attention import ContextKV
from qkv.nn.embeddings import Embeddings
from qkv.nn.encoder import Encoder
from qkv.nn.kv_cache import KVCache

__all__ = ["EncoderDecoder", "Seq2SeqOutput", "Decoder", "DecoderOutput", "SharedTokenEmbeddings", "shift_right"]


def shift_right(labels: Tensor, start_id: int, pad_id: int) -> Tensor:
    """``(B,T)`` labels → ``(B,T)`` decoder inputs: ``[start, labels[0], …, labels[T-2]]``, -100 → ``pad_id``."""
    out = labels.new_full(labels.shape, start_id)
    out[:, 1:] = labels[:, :-1]
    return out.masked_fill(out == IGNORE_INDEX, pad_id)


class SharedTokenEmbeddings(Embeddings):
    """:class:`~qkv.nn.encoder.Embeddings` that read another module's token table (not registered
    here: the table is saved once, with its owner). Same arguments as ``Embeddings`` plus ``tokens``."""

    def __init__(self, tokens: nn.Embedding, d_model: int, **kwargs):
        super().__init__(1, d_model, **{**kwargs, "pad_token_id": None})
        del self._modules["tokens"]  # the table built above is dropped
        self._shared = (tokens,)  # a tuple: not a submodule

    @property
    def tokens(self) -> nn.Embedding:
        return self._shared[0]


@dataclass
class DecoderOutput:
    """Result of :class:`Decoder`: ``last_hidden_state (B,T,C)``; per layer, when asked,
    ``attentions (B,H,T,T)`` (causal self-attention) and ``cross_attentions (B,H,T,S)``."""

    last_hidden_state: Tensor
    attentions: tuple[Tensor, ...] | None = None
    cross_attentions: tuple[Tensor, ...] | None = None


class Decoder(nn.Module):
    """Embeddings, decoder layers, an optional final norm.

    Args:
        embeddings: an :class:`~qkv.nn.encoder.Embeddings` (positions count the decoder's own
            tokens from 0).
        layers: :class:`~qkv.nn.decoder_layer.DecoderLayer` s.
        max_len: longest target accepted.
        final_norm: for pre-LN stacks, or ``None``.
        qk_positions: module ``length -> (T,C)`` passed to every layer's self-attention as ``qk_pos``, or ``None``.
    """

    def __init__(self, embeddings: Embeddings, layers: list[nn.Module], *, max_len: int,
                 final_norm: nn.Module | None = None, qk_positions: nn.Module | None = None):
        super().__init__()
        self.embeddings = embeddings
        self.layers = nn.ModuleList(layers)
        self.final_norm, self.qk_positions, self.max_len = final_norm, qk_positions, max_len

    def project_context(self, context: Tensor) -> list[ContextKV]:
        """Each layer's cross-attention keys and values of ``context``: computed once per source."""
        return [layer.cross_attention.project_context(context) for layer in self.layers]

    def forward(self, input_ids: Tensor, context: Tensor | list[ContextKV], attention_mask: Tensor | None = None,
                context_mask: Tensor | None = None, *, output_attentions: bool = False,
                cache: KVCache | None = None) -> DecoderOutput:
        """``(B,T)`` target ids over a ``(B,S,C)`` context (the encoder's output, or its keys and values
        per layer from :meth:`project_context`) → :class:`DecoderOutput`.

        ``cache``: a :class:`~qkv.nn.kv_cache.KVCache` of the P target positions decoded so far: the
        T new tokens sit at positions P … P+T-1, each layer's self-attention appends their keys and
        values and attends over all P+T (``attention_mask`` then ``(B,P+T)``); extended in place.
        """
        T = input_ids.shape[1]
        start = 0 if cache is None else cache.seen
        if start + T > self.max_len:
            raise ValueError(f"target length {start + T} exceeds max_len={self.max_len}; generate fewer tokens or "
                             "build a model with a larger max_len")
        if cache is not None and output_attentions:
            raise ValueError("output_attentions is not available with a cache; run without cache=")
        pad = None
        if attention_mask is not None:
            pad = attention_mask.bool()
            pad = None if bool(pad.all()) else pad
        positions = None if start == 0 else torch.arange(start, start + T, device=input_ids.device)  # (T,)
        qk_pos = self.qk_positions(start + T)[start:] if self.qk_positions is not None else None  # (T,C)
        x = self.embeddings(input_ids, None, positions)  # (B,T) -> (B,T,C)
        sa, ca = ([], []) if output_attentions else (None, None)
        for i, layer in enumerate(self.layers):
            ctx = context[i] if isinstance(context, list) else context
            out = layer(x, ctx, pad, context_mask, need_weights=output_attentions, qk_pos=qk_pos,
                        cache=None if cache is None else cache.layer(i))
            x = out.output
            if sa is not None:
                sa.append(out.self_attention_weights)
                ca.append(out.cross_attention_weights)
        if cache is not None:
            cache.seen = start + T
        if self.final_norm is not None:
            x = self.final_norm(x)
        return DecoderOutput(x, None if sa is None else tuple(sa), None if ca is None else tuple(ca))


@dataclass
class Seq2SeqOutput:
    """Result of :class:`EncoderDecoder`.

    Attributes:
        loss: mean cross-entropy of ``labels`` (-100 ignored) when given, else ``None``.
        logits: ``(B,T,V)``; row t predicts target token t.
        encoder_last_hidden_state: ``(B,S,C)``.
        encoder_attentions: per encoder layer ``(B,H,S,S)`` when asked.
        decoder_attentions: per decoder layer ``(B,H,T,T)`` (causal) when asked.
        cross_attentions: per decoder layer ``(B,H,T,S)`` when asked.
    """

    loss: Tensor | None
    logits: Tensor
    encoder_last_hidden_state: Tensor
    encoder_attentions: tuple[Tensor, ...] | None = None
    decoder_attentions: tuple[Tensor, ...] | None = None
    cross_attentions: tuple[Tensor, ...] | None = None


class EncoderDecoder(nn.Module):
    """Encoder + decoder + the LM head tied to the decoder's token embeddings.

    Args:
        encoder: a bidirectional :class:`~qkv.nn.encoder.Encoder`.
        decoder: a :class:`Decoder`.
        decoder_start_token_id: the first decoder input (the task's BOS).
        pad_token_id: fills the -100 positions of shifted labels, and a finished row while generating.
        eos_token_id: the token that ends a target (generation's default), or ``None``.
        output_scale: the decoder's output is multiplied by it before the head (T5: ``C**-0.5``).
        logits_bias: add a fixed ``(V,)`` bias to the logits (the buffer ``logits_bias``, zeros
            until loaded: Marian's and BART's ``final_logits_bias``).
        config: the :class:`~qkv.config.ModelConfig` it was built from, or ``None``.
    """

    def __init__(self, encoder: Encoder, decoder: Decoder, *, decoder_start_token_id: int = 1,
                 pad_token_id: int = 0, eos_token_id: int | None = None, output_scale: float = 1.0,
                 logits_bias: bool = False, config=None):
        super().__init__()
        if not isinstance(encoder, Encoder) or encoder.causal:
            raise ValueError("EncoderDecoder needs a bidirectional qkv Encoder (causal=False)")
        self.config, self.encoder, self.decoder = config, encoder, decoder
        self.decoder_start_token_id, self.pad_token_id = decoder_start_token_id, pad_token_id
        self.eos_token_id, self.output_scale = eos_token_id, float(output_scale)
        bias = torch.zeros(self.decoder_weight.shape[0]) if logits_bias else None  # (V,)
        self.register_buffer("logits_bias", bias)

    @property
    def decoder_weight(self) -> Tensor:
        """``(V,C)`` — the decoder's token table (tied head)."""
        return self.decoder.embeddings.tokens.weight

    @property
    def target_vocab_size(self) -> int:
        """V of the target side (the decoder's token table)."""
        return self.decoder_weight.shape[0]

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """``(B,S)`` source ids → ``(B,S,C)`` encoder states."""
        return self.encoder(input_ids, attention_mask).last_hidden_state

    def logits(self, h: Tensor) -> Tensor:
        """Decoder states ``(…,C)`` → logits ``(…,V)``: the tied head (scale and bias included)."""
        if self.output_scale != 1.0:
            h = h * self.output_scale
        out = F.linear(h, self.decoder_weight)  # (…,C)(C,V) -> (…,V)
        return out if self.logits_bias is None else out + self.logits_bias.to(out.dtype)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, decoder_input_ids: Tensor | None = None,
                decoder_attention_mask: Tensor | None = None, labels: Tensor | None = None,
                output_attentions: bool = False, *, label_smoothing: float = 0.0,
                sparse_logits: bool = False) -> Seq2SeqOutput:
        """Encode the source, decode the target.

        Args:
            input_ids: ``(B,S)`` source ids. attention_mask: ``(B,S)``, 1 = real token.
            decoder_input_ids: ``(B,T)`` target inputs; default ``shift_right(labels)``.
            decoder_attention_mask: ``(B,T)``, 1 = real token.
            labels: ``(B,T)`` target ids, -100 where not scored.
            output_attentions: also return self- and cross-attention weights.
            label_smoothing: the loss's label smoothing (0: plain cross-entropy).
            sparse_logits: with ``labels``, run the head on the N scored positions only; ``logits``
                is then ``(N,V)`` in row-major order (training: the head is not paid for padding).

        Returns:
            :class:`Seq2SeqOutput`.
        """
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("pass decoder_input_ids or labels (decoder inputs are the labels shifted right)")
            decoder_input_ids = shift_right(labels, self.decoder_start_token_id, self.pad_token_id)
        if labels is not None and tuple(labels.shape) != tuple(decoder_input_ids.shape):
            raise ValueError(f"labels must have the shape of decoder_input_ids {tuple(decoder_input_ids.shape)}, "
                             f"got {tuple(labels.shape)}")
        enc = self.encoder(input_ids, attention_mask, output_attentions=output_attentions)
        context_mask = None if attention_mask is None else attention_mask.bool()
        dec = self.decoder(decoder_input_ids, enc.last_hidden_state, decoder_attention_mask, context_mask,
                           output_attentions=output_attentions)
        h = dec.last_hidden_state  # (B,T,C)
        scored = None
        if labels is not None and sparse_logits:
            keep = labels != IGNORE_INDEX  # (B,T)
            h, scored = h[keep], labels[keep]  # (N,C), (N,)
        logits = self.logits(h)  # (B,T,V) | (N,V)
        loss = None
        if labels is not None:
            flat = scored if scored is not None else labels.reshape(-1)  # (N,) | (B·T,)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), flat, ignore_index=IGNORE_INDEX,
                                   label_smoothing=label_smoothing)
        return Seq2SeqOutput(loss, logits, enc.last_hidden_state, enc.attentions, dec.attentions, dec.cross_attentions)

    def generate(self, input_ids: Tensor, attention_mask: Tensor | None = None, *, max_new_tokens: int = 32,
                 decoder_start_token_id: int | None = None, eos_token_id: int | None = None, **options) -> Tensor:
        """Translate ``(B,S)`` sources → ``(B, 1 + n)`` ids beginning with the start token
        (:func:`qkv.generation.seq2seq.generate_seq2seq`: greedy by default; ``num_beams``,
        ``length_penalty``, ``early_stopping``, ``do_sample`` … in ``options``). A finished row is
        padded with ``pad_token_id``; ``eos_token_id`` defaults to the model's."""
        return generate_seq2seq(self, input_ids, attention_mask, max_new_tokens=max_new_tokens,
                                decoder_start_token_id=decoder_start_token_id,
                                eos_token_id=self.eos_token_id if eos_token_id is None else eos_token_id, **options)
