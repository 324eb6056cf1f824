"""The encoder: token + position + segment embeddings (:mod:`qkv.nn.embeddings`), then a stack of
transformer layers.

Legend: B batch, T length, C model width, E embedding width (C unless projected), H heads,
V vocabulary.

Modules here take plain arguments; :func:`qkv.models.builders.build_encoder` assembles them from
a :class:`qkv.config.ModelConfig`. The default path is fast: no attention weights are formed
(fused ``scaled_dot_product_attention``), an all-real padding mask is dropped so the kernel runs
unmasked, and absent segment ids add one embedding row instead of a lookup.

Two entry points: :meth:`Encoder.forward` on a padded ``(B,T)`` batch (attention weights on request)
and :meth:`Encoder.forward_packed` on a :class:`~qkv.nn.packed.PackedBatch` — sequences back to
back, no padded position computed (N = Σ lengths tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from qkv.nn.embeddings import Embeddings, positions_at
from qkv.nn.kv_cache import KVCache
from qkv.nn.packed import PackedBatch

__all__ = ["Embeddings", "Encoder", "EncoderOutput", "PackedEncoderOutput", "PackedBatch"]


@dataclass
class EncoderOutput:
    """Result of :class:`Encoder`.

    Attributes:
        last_hidden_state: ``(B,T,C)`` output of the last layer (after the final norm, pre-LN).
        hidden_states: when requested, ``n_layers + 1`` tensors ``(B,T,C)``: the embedding output
            and every layer's output (the last equals ``last_hidden_state``); else ``None``.
        attentions: when requested, one ``(B,H,T,T)`` tensor of exact attention weights per
            layer; else ``None``.
        pooler_output: ``(B,C)`` output of the encoder's pooler (BERT's ``tanh(dense(h[:, 0]))``)
            when it has one; else ``None``.
        cache: the :class:`~qkv.nn.kv_cache.KVCache` given to :meth:`Encoder.forward`, now
            holding these positions too; else ``None``.
    """

    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    pooler_output: Tensor | None = None
    cache: KVCache | None = None


@dataclass
class PackedEncoderOutput:
    """Result of :meth:`Encoder.forward_packed` (N = Σ lengths packed tokens).

    Attributes:
        last_hidden_state: ``(N,C)`` output of the last layer (after the final norm, pre-LN).
        hidden_states: when requested, ``n_layers + 1`` tensors ``(N,C)``; else ``None``.
        pooler_output: ``(B,C)`` the pooler of each sequence's first token, or ``None``.
        lengths: the length of each sequence.
        attentions: when requested, ``n_layers`` tensors ``(B,H,T,T)`` (T = the longest length):
            sequence i's exact weights in ``[i, :, :n_i, :n_i]``, zeros elsewhere; else ``None``.
    """

    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None
    pooler_output: Tensor | None
    lengths: tuple[int, ...]
    attentions: tuple[Tensor, ...] | None = None


def run_layers(stack: nn.Module, x: Tensor, padding_mask: Tensor | None, qk_pos: Tensor | None,
               output_hidden_states: bool, output_attentions: bool, *, causal: bool = False,
               cache: KVCache | None = None) -> EncoderOutput:
    """Layers → final norm → pooler of ``stack`` (its ``layers``, ``final_norm``, ``pooler``) on embedded
    ``x`` ``(B,T,C)``: the one loop of the text encoder and the vision encoder (``cache``: each layer its
    own :class:`~qkv.nn.kv_cache.LayerCache`)."""
    hidden = [x] if output_hidden_states else None
    attentions = [] if output_attentions else None
    for i, layer in enumerate(stack.layers):
        kw = {"need_weights": output_attentions} if cache is None else {"cache": cache.layer(i)}
        out = layer(x, padding_mask, qk_pos=qk_pos, causal=causal, **kw)
        x = out.output
        if hidden is not None:
            hidden.append(x)
        if attentions is not None:
            attentions.append(out.attention_weights)
    if stack.final_norm is not None:
        x = stack.final_norm(x)
        if hidden is not None:
            hidden[-1] = x
    return EncoderOutput(
        last_hidden_state=x,
        hidden_states=tuple(hidden) if hidden is not None else None,
        attentions=tuple(attentions) if attentions is not None else None,
        pooler_output=stack.pooler(x) if stack.pooler is not None else None,  # (B,T,C) -> (B,C)
        cache=cache,
    )


class Encoder(nn.Module):
    """Embeddings, ``n_layers`` transformer layers, an optional final norm (pre-LN), an optional
    pooler.

    Args:
        embeddings: an :class:`Embeddings`.
        layers: the transformer layers (see :class:`qkv.nn.layer.TransformerLayer`).
        max_len: longest sequence accepted.
        final_norm: applied to the last layer's output (pre-LN stacks), or ``None``.
        qk_positions: module ``length -> (T,C)`` passed to every layer as ``qk_pos`` (positions
            added to the query and key inputs only), or ``None``.
        pooler: module ``(B,T,C) -> (B,C)`` applied to the last hidden state, its result returned
            as ``pooler_output`` (BERT's: :class:`qkv.nn.pooler.Pooler`), or ``None``.
        causal: every layer's attention is causal (a decoder: query i sees keys 0 … i only).
        embed_proj: ``nn.Linear(E, C)`` applied to the embeddings when they are E wide (ELECTRA's
            ``embeddings_project``), or ``None``; the first hidden state is its output.
        config: the :class:`~qkv.config.ModelConfig` the encoder was built from (kept as
            ``.config``; saving and exporting read it), or ``None``.
    """

    def __init__(
        self,
        embeddings: Embeddings,
        layers: list[nn.Module],
        *,
        max_len: int,
        final_norm: nn.Module | None = None,
        qk_positions: nn.Module | None = None,
        pooler: nn.Module | None = None,
        embed_proj: nn.Module | None = None,
        causal: bool = False,
        config=None,
    ):
        super().__init__()
        self.config = config
        self.causal = bool(causal)
        self.embeddings = embeddings
        self.embed_proj = embed_proj
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm
        self.qk_positions = qk_positions
        self.pooler = pooler
        self.max_len = max_len

    @property
    def vocab_size(self) -> int:
        return self.embeddings.tokens.num_embeddings

    def _check(self, input_ids: Tensor, attention_mask: Tensor | None, token_type_ids: Tensor | None):
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
            got = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be an integer tensor (B, T), got {got}")
        B, T = input_ids.shape
        self._check_length(T)
        for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if t is not None and tuple(t.shape) != (B, T):
                raise ValueError(f"{name} must have shape (B, T) = ({B}, {T}), got {tuple(t.shape)}")
        self._check_values(input_ids, token_type_ids)

    def _check_length(self, T: int) -> None:
        if T > self.max_len:
            raise ValueError(
                f"sequence length {T} exceeds max_len={self.max_len} (the size of the position "
                "table); truncate the input or build a model with a larger max_len"
            )

    def _check_values(self, input_ids: Tensor, token_type_ids: Tensor | None) -> None:
        if input_ids.numel():
            lo, hi = int(input_ids.min()), int(input_ids.max())
            if lo < 0 or hi >= self.vocab_size:
                raise ValueError(
                    f"input_ids must lie in [0, vocab_size={self.vocab_size}); found values in "
                    f"[{lo}, {hi}]"
                )
        segments = self.embeddings.segments
        # a model without a segment table (DistilBERT, ModernBERT, GPT-2) has no use for segment ids, as
        # transformers' versions take none: a tokenizer's ids are accepted and ignored, not refused
        if segments is not None and token_type_ids is not None and token_type_ids.numel():
            n = segments.num_embeddings
            lo, hi = int(token_type_ids.min()), int(token_type_ids.max())
            if lo < 0 or hi >= n:
                raise ValueError(f"token_type_ids must lie in [0, type_vocab_size={n}); found [{lo}, {hi}]")

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        position_ids: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> EncoderOutput:
        """Encode a padded batch (see :meth:`forward_packed` for a padding-free one).

        Args:
            input_ids: ``(B,T)`` token ids in ``[0, V)``.
            attention_mask: ``(B,T)``, 1/True = real token, 0/False = padding (keys only are
                masked: outputs at padded positions are defined but meaningless).
            token_type_ids: ``(B,T)`` segment ids (default: all 0; ignored by a model without a
                segment table, ``type_vocab_size=0``).
            output_hidden_states: return the embedding output and every layer's output.
            output_attentions: return every layer's exact ``(B,H,T,T)`` attention weights.
            position_ids: ``(B,T)`` or ``(T,)`` position of each token for input (absolute)
                position encodings (default ``0 … T-1``; a left-padded batch counts from each row's
                first real token). Relative encodings (relative, T5, ALiBi, RoPE) read offsets
                only and ignore it.
            cache: a :class:`~qkv.nn.kv_cache.KVCache` of the P positions seen so far
                (incremental decoding, causal stacks): ``input_ids`` are the T new tokens,
                ``attention_mask`` is ``(B,P+T)`` over all of them, ``position_ids`` default to
                ``mask.cumsum(-1) - 1`` (each row counted from its first real token) or
                ``P … P+T-1``; the cache is extended in place and returned. Not with
                ``output_attentions``.

        Returns:
            :class:`EncoderOutput`.

        Raises:
            ValueError: ids outside the vocabulary, a sequence longer than ``max_len``, or
                mis-shaped masks.
        """
        if cache is not None:
            return self._forward_cached(input_ids, attention_mask, token_type_ids, position_ids, cache,
                                        output_hidden_states, output_attentions)
        self._check(input_ids, attention_mask, token_type_ids)
        padding_mask = None
        if attention_mask is not None:
            padding_mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask != 0
            if bool(padding_mask.all()):
                padding_mask = None  # nothing to mask: keep the unmasked fused kernel
        if position_ids is not None:
            self._check_positions(position_ids, tuple(input_ids.shape))
        return self._stack(input_ids, token_type_ids, position_ids, padding_mask, output_hidden_states,
                           output_attentions)

    def _stack(self, input_ids: Tensor, token_type_ids: Tensor | None, position_ids: Tensor | None,
               padding_mask: Tensor | None, output_hidden_states: bool, output_attentions: bool,
               cache: KVCache | None = None) -> EncoderOutput:
        """Embeddings → layers → final norm → pooler on checked inputs (``cache``: each layer its own
        :class:`~qkv.nn.kv_cache.LayerCache`, ``padding_mask`` then over all cached keys)."""
        qk_pos = self._qk_pos(input_ids.shape[1], position_ids)  # (T,C) | (B,T,C) | None
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B,T,E)
        if self.embed_proj is not None:
            x = self.embed_proj(x)  # (B,T,E) -> (B,T,C)
        return run_layers(self, x, padding_mask, qk_pos, output_hidden_states, output_attentions,
                          causal=self.causal, cache=cache)

    def _forward_cached(self, input_ids: Tensor, attention_mask: Tensor | None, token_type_ids: Tensor | None,
                        position_ids: Tensor | None, cache: KVCache, output_hidden_states: bool,
                        output_attentions: bool) -> EncoderOutput:
        """:meth:`forward` of T new tokens after the cache's P positions (see its ``cache``)."""
        if not isinstance(cache, KVCache):
            raise ValueError(f"cache must be a qkv.nn.kv_cache.KVCache, got {type(cache).__name__}")
        if not self.causal:
            raise ValueError("a KV cache needs a causal stack (Encoder(causal=True)): in a bidirectional one "
                             "earlier positions change when a token is appended")
        if output_attentions:
            raise ValueError("output_attentions is not available with a cache; run without cache=")
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
            got = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be an integer tensor (B, T), got {got}")
        B, T = input_ids.shape
        P = cache.seen
        S = P + T
        self._check_length(S)
        if attention_mask is not None and tuple(attention_mask.shape) != (B, S):
            raise ValueError(f"with a cache of {P} positions attention_mask must cover all of them and the new "
                             f"tokens: (B, P+T) = ({B}, {S}), got {tuple(attention_mask.shape)}")
        if token_type_ids is not None and tuple(token_type_ids.shape) != (B, T):
            raise ValueError(f"token_type_ids must have shape (B, T) = ({B}, {T}), got {tuple(token_type_ids.shape)}")
        self._check_values(input_ids, token_type_ids)
        padding_mask = None
        if attention_mask is not None:
            padding_mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask != 0
        if position_ids is None and (self.embeddings.positions is not None or self.qk_positions is not None):
            if padding_mask is None:
                position_ids = torch.arange(P, S, device=input_ids.device)  # (T,)
            else:  # counted from each row's first real token (padding clamped to 0)
                position_ids = (padding_mask.long().cumsum(-1) - 1).clamp(min=0)[:, P:]  # (B,S) -> (B,T)
        elif position_ids is not None:
            self._check_positions(position_ids, (B, T))
        if padding_mask is not None and bool(padding_mask.all()):
            padding_mask = None  # nothing to mask
        out = self._stack(input_ids, token_type_ids, position_ids, padding_mask, output_hidden_states, False, cache)
        cache.seen = S
        return out

    def _qk_pos(self, T: int, position_ids: Tensor | None) -> Tensor | None:
        """Query/key-only positions: ``(T,C)``, or ``(B,T,C)`` / ``(T,C)`` rows of ``position_ids``."""
        if self.qk_positions is None:
            return None
        if position_ids is None:
            return self.qk_positions(T)  # (T,C)
        if not position_ids.numel():
            return self.qk_positions(max(T, 1))[:T]
        return positions_at(self.qk_positions, position_ids)  # (B,T,C) | (T,C)

    def _check_positions(self, position_ids: Tensor, shape: tuple[int, int]) -> None:
        if (not isinstance(position_ids, Tensor) or position_ids.is_floating_point()
                or tuple(position_ids.shape) not in (shape, shape[1:])):
            got = tuple(position_ids.shape) if isinstance(position_ids, Tensor) else type(position_ids).__name__
            raise ValueError(f"position_ids must be an integer tensor (B, T) = {shape} or (T,), got {got}")
        if position_ids.numel() and int(position_ids.min()) < 0:
            raise ValueError(f"position_ids must be ≥ 0, found {int(position_ids.min())}")

    def forward_packed(self, batch: PackedBatch, output_hidden_states: bool = False,
                       output_attentions: bool = False) -> PackedEncoderOutput:
        """Encode sequences without padding: no padded position is computed anywhere.

        Args:
            batch: the sequences back to back (:class:`~qkv.nn.packed.PackedBatch`).
            output_hidden_states: return the embedding output and every layer's output.
            output_attentions: return every layer's exact attention weights (zero-padded
                ``(B,H,T,T)``, the layout :meth:`forward` gives).

        Returns:
            :class:`PackedEncoderOutput` with ``(N,C)`` states: for each sequence what
            :meth:`forward` gives at its real positions when it is right-padded in a batch with a
            padding mask (up to float rounding).
        """
        if not isinstance(batch, PackedBatch):
            raise ValueError(f"forward_packed needs a qkv.nn.packed.PackedBatch, got {type(batch).__name__}")
        self._check_length(batch.max_len)
        self._check_values(batch.input_ids, batch.token_type_ids)
        T, lengths = batch.max_len, list(batch.lengths)
        qk_pos = self.qk_positions(T) if self.qk_positions is not None else None  # (T,C)
        x = self.embeddings.forward_packed(batch.input_ids, batch.positions(), batch.token_type_ids)  # (N,E)
        if self.embed_proj is not None:
            x = self.embed_proj(x)  # (N,E) -> (N,C)
        hidden = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for layer in self.layers:
            out = layer.forward_packed(x, lengths, qk_pos=qk_pos, causal=self.causal, need_weights=output_attentions)
            x = out.output  # (N,C)
            if hidden is not None:
                hidden.append(x)
            if attentions is not None:
                attentions.append(out.attention_weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if hidden is not None:
                hidden[-1] = x
        pooled = None
        if self.pooler is not None and lengths:
            first = x[batch.starts.clamp(max=max(0, x.shape[0] - 1))]  # (B,C) each sequence's first token
            pooled = self.pooler(first[:, None])  # (B,1,C) -> (B,C)
        return PackedEncoderOutput(x, tuple(hidden) if hidden is not None else None, pooled, batch.lengths,
                                   tuple(attentions) if attentions is not None else None)
