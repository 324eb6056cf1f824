"""The encoder–decoder (Prince §12.8): a bidirectional encoder reads the source once; a decoder
generates the target, each layer attending causally to the target so far and, through
cross-attention, to the encoder's output.

Legend: B batch, S source length, T target length, C model width, V vocabulary.

* the encoder is an :class:`~qkv.nn.encoder.Encoder` (bidirectional);
* the decoder (:class:`Decoder`) embeds the target with the encoder's token table (one shared
  vocabulary: one tensor, saved once) and its own positions, runs
  :class:`~qkv.nn.decoder_layer.DecoderLayer` s, and a final norm (pre-LN);
* the LM head is tied to the token table: ``logits = h Eᵀ`` (no bias).

Loss (the T5/BART convention of Hugging Face): ``labels (B,T)``, -100 where not scored; without
``decoder_input_ids`` the decoder reads ``labels`` shifted right behind the decoder start token
(:func:`shift_right`), so position t predicts ``labels[t]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.models.mlm import IGNORE_INDEX
from qkv.nn.attention import ContextKV
from qkv.nn.embeddings import Embeddings
from qkv.nn.encoder import Encoder

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
                context_mask: Tensor | None = None, *, output_attentions: bool = False) -> DecoderOutput:
        """``(B,T)`` target ids over a ``(B,S,C)`` context (the encoder's output, or its keys and values
        per layer from :meth:`project_context`) → :class:`DecoderOutput`."""
        T = input_ids.shape[1]
        if T > self.max_len:
            raise ValueError(f"target length {T} exceeds max_len={self.max_len}; generate fewer tokens or "
                             "build a model with a larger max_len")
        pad = None
        if attention_mask is not None:
            pad = attention_mask.bool()
            pad = None if bool(pad.all()) else pad
        qk_pos = self.qk_positions(T) if self.qk_positions is not None else None  # (T,C)
        x = self.embeddings(input_ids)  # (B,T) -> (B,T,C)
        sa, ca = ([], []) if output_attentions else (None, None)
        for i, layer in enumerate(self.layers):
            ctx = context[i] if isinstance(context, list) else context
            out = layer(x, ctx, pad, context_mask, need_weights=output_attentions, qk_pos=qk_pos)
            x = out.output
            if sa is not None:
                sa.append(out.self_attention_weights)
                ca.append(out.cross_attention_weights)
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
        pad_token_id: fills the -100 positions of shifted labels.
        config: the :class:`~qkv.config.ModelConfig` it was built from, or ``None``.
    """

    def __init__(self, encoder: Encoder, decoder: Decoder, *, decoder_start_token_id: int = 1,
                 pad_token_id: int = 0, config=None):
        super().__init__()
        if not isinstance(encoder, Encoder) or encoder.causal:
            raise ValueError("EncoderDecoder needs a bidirectional qkv Encoder (causal=False)")
        self.config, self.encoder, self.decoder = config, encoder, decoder
        self.decoder_start_token_id, self.pad_token_id = decoder_start_token_id, pad_token_id

    @property
    def decoder_weight(self) -> Tensor:
        """``(V,C)`` — the decoder's token table (tied head)."""
        return self.decoder.embeddings.tokens.weight

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, decoder_input_ids: Tensor | None = None,
                decoder_attention_mask: Tensor | None = None, labels: Tensor | None = None,
                output_attentions: bool = False) -> Seq2SeqOutput:
        """Encode the source, decode the target.

        Args:
            input_ids: ``(B,S)`` source ids. attention_mask: ``(B,S)``, 1 = real token.
            decoder_input_ids: ``(B,T)`` target inputs; default ``shift_right(labels)``.
            decoder_attention_mask: ``(B,T)``, 1 = real token.
            labels: ``(B,T)`` target ids, -100 where not scored.
            output_attentions: also return self- and cross-attention weights.

        Returns:
            :class:`Seq2SeqOutput`.
        """
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("pass decoder_input_ids or labels (decoder inputs are the labels shifted right)")
            decoder_input_ids = shift_right(labels, self.decoder_start_token_id, self.pad_token_id)
        enc = self.encoder(input_ids, attention_mask, output_attentions=output_attentions)
        context_mask = None if attention_mask is None else attention_mask.bool()
        dec = self.decoder(decoder_input_ids, enc.last_hidden_state, decoder_attention_mask, context_mask,
                           output_attentions=output_attentions)
        logits = F.linear(dec.last_hidden_state, self.decoder_weight)  # (B,T,C)(C,V) -> (B,T,V)
        loss = None
        if labels is not None:
            if tuple(labels.shape) != tuple(decoder_input_ids.shape):
                raise ValueError(f"labels must have the shape of decoder_input_ids {tuple(decoder_input_ids.shape)}, "
                                 f"got {tuple(labels.shape)}")
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),  # (B·T,V), (B·T,)
                                   ignore_index=IGNORE_INDEX)
        return Seq2SeqOutput(loss, logits, enc.last_hidden_state, enc.attentions, dec.attentions, dec.cross_attentions)

    @torch.no_grad()
    def generate(self, input_ids: Tensor, attention_mask: Tensor | None = None, *, max_new_tokens: int = 32,
                 decoder_start_token_id: int | None = None, eos_token_id: int | None = None) -> Tensor:
        """Greedy decoding: ``(B,S)`` source → ``(B, 1 + n)`` ids beginning with the start token.

        The encoder runs once and each layer's context keys/values are projected once; the decoder
        then runs on the whole growing prefix at every step (recomputed: quadratic in the output
        length, fine for short outputs). A row that has produced ``eos_token_id`` is padded with
        ``pad_token_id`` after it; generation stops when every row has.
        """
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int ≥ 0, got {max_new_tokens!r}")
        start = self.decoder_start_token_id if decoder_start_token_id is None else decoder_start_token_id
        enc = self.encoder(input_ids, attention_mask).last_hidden_state  # (B,S,C)
        context_mask = None if attention_mask is None else attention_mask.bool()
        kv = self.decoder.project_context(enc)
        B = input_ids.shape[0]
        out = input_ids.new_full((B, 1), start)
        done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
        for _ in range(max_new_tokens):
            h = self.decoder(out, kv, None, context_mask).last_hidden_state[:, -1]  # (B,C)
            nxt = F.linear(h, self.decoder_weight).argmax(-1)  # (B,C) -> (B,V) -> (B,)
            nxt = nxt.masked_fill(done, self.pad_token_id)
            out = torch.cat([out, nxt[:, None]], dim=1)  # (B,t) -> (B,t+1)
            if eos_token_id is not None:
                done |= nxt == eos_token_id
                if bool(done.all()):
                    break
        return out
