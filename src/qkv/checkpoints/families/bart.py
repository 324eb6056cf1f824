"""Hugging Face BART ⇄ qkv (``model_type: bart``; ``BartForConditionalGeneration``).

Legend: C ``d_model``, V ``vocab_size``, P ``max_position_embeddings``.

BART is a post-LN encoder–decoder, qkv's :class:`~qkv.models.seq2seq.EncoderDecoder` (kind
``"encoder_decoder"``) with learned positions whose table starts at row 2 (``position_offset=2``:
BART's ``BartLearnedPositionalEmbedding`` reserves two rows), a norm on each side's embedding sum
(``layernorm_embedding``), token embeddings scaled by √C only when ``scale_embedding``, no final
norms and a ``final_logits_bias``. One vocabulary: ``model.shared`` is the token table of both
sides and of the tied head. The layers' names are :mod:`._bart_like`'s. Embeddings:

* ``model.shared`` → ``encoder.embeddings.tokens`` (``model.encoder.embed_tokens`` /
  ``model.decoder.embed_tokens``, when stored, must equal it);
* ``model.encoder.embed_positions (P+2,C)`` → ``encoder.embeddings.positions``,
  ``model.decoder.embed_positions`` → ``decoder.embeddings.positions``;
* ``model.encoder.layernorm_embedding`` → ``encoder.embeddings.norm``, the decoder's likewise.

Config: ``decoder_start_token_id`` (BART starts from ``eos``), ``eos_token_id``, ``pad_token_id``,
``activation_function``, ``dropout``, ``attention_dropout``; ``activation_dropout`` and
``classifier_dropout`` are accepted and not kept (they change no output). Refused: encoder and
decoder of different heads or feed-forward widths, layer drop. Generation options
(``forced_bos_token_id``, ``forced_eos_token_id``, ``no_repeat_ngram_size`` …) are not part of the
model: :func:`qkv.generation.seq2seq.decode` does not apply them.

Written: ``BartForConditionalGeneration`` from kind ``"encoder_decoder"`` (the model's family
``bart``; every option the format cannot express is refused by name).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from qkv.checkpoints.families import _bart_like as bl
from qkv.checkpoints.families._common import (Imported, architectures, check_plan, check_tied, refuse_unexpressible,
                                              state_from_plan, tensors_from_plan)
from qkv.config import ModelConfig
from qkv.errors import CheckpointError
from qkv.models.heads import TaskConfig

MODEL_TYPE = "bart"
NAME = "BART"
ARCHITECTURES = {"encoder_decoder": "BartForConditionalGeneration"}
SUPPORTED = "BartForConditionalGeneration (an encoder-decoder with its tied LM head)"
OFFSET = 2  # BartLearnedPositionalEmbedding's first two rows are never used
_TABLES = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")


def _plan(config: ModelConfig) -> bl.Plan:
    plan = bl.base_plan(config, config.max_len + OFFSET)
    plan.rows.append(("model.shared.weight", "encoder.embeddings.tokens.weight", "VC"))
    for side in ("encoder", "decoder"):
        plan.rows += [(f"model.{side}.embed_positions.weight", f"{side}.embeddings.positions.weight", "PC"),
                      (f"model.{side}.layernorm_embedding.weight", f"{side}.embeddings.norm.weight", "C"),
                      (f"model.{side}.layernorm_embedding.bias", f"{side}.embeddings.norm.bias", "C")]
    return plan


def _config(hf: dict[str, Any], source: str) -> ModelConfig:
    fields = bl.model_fields(hf, source)
    fields["decoder"]["start_token_id"] = hf.get("decoder_start_token_id", hf.get("eos_token_id", 2))
    try:
        return ModelConfig.from_flat(**fields, position="learned", position_offset=OFFSET, embedding_norm=True,
                                     family=MODEL_TYPE)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{source}: {e}") from e


def read(hf: dict[str, Any], tensors: dict[str, Tensor], *, config_source: str, weights_source: str) -> Imported:
    """A ``BartForConditionalGeneration`` checkpoint as qkv's config, kind and state dict.

    Raises:
        CheckpointError: another architecture, a missing, mis-shaped, unexpected or unknown tensor,
            an untied head, a config option qkv does not support.
    """
    archs = architectures(hf)
    if archs and archs != ["BartForConditionalGeneration"]:
        raise CheckpointError(f"{config_source}: architectures={archs!r} is not supported; qkv loads {SUPPORTED}")
    config = _config(hf, config_source)
    plan = _plan(config)
    check_plan(tensors, plan, weights_source, ignored=_TABLES[1:] + (bl.LM_HEAD, bl.LOGITS_BIAS),
               owned=("model.",), layers_field="encoder_layers/decoder_layers", n_layers=config.n_layers,
               unknown=f"a BART model ({SUPPORTED})")
    for name in _TABLES[1:]:
        check_tied(tensors, name, "model.shared.weight", weights_source, what="model.shared.weight")
    bl.check_head(tensors, "model.shared.weight", weights_source)
    state = state_from_plan(tensors, plan)
    state["logits_bias"] = bl.bias_in(tensors, plan.dims["W"], weights_source)
    return Imported(config, "encoder_decoder", None, state)


def config_to_hf(config: ModelConfig, kind: str, task: TaskConfig | None = None) -> dict[str, Any]:
    """The ``config.json`` of ``BartForConditionalGeneration``; raises :class:`CheckpointError`
    naming every option BART cannot express."""
    extra = [] if kind == "encoder_decoder" else [f"kind {kind!r} (BART is an encoder-decoder)"]
    dec = config.decoder
    if dec is not None and dec.output_scale != 1.0:
        extra.append(f"decoder.output_scale={dec.output_scale} (BART needs 1.0)")
    if dec is not None and dec.vocab_size is not None:
        extra.append(f"decoder.vocab_size={dec.vocab_size} (BART has one vocabulary)")
    refuse_unexpressible(config, NAME, {**bl.NEEDS, "position": "learned", "embedding_norm": True,
                                        "position_offset": OFFSET}, extra)
    hf = {"architectures": [ARCHITECTURES["encoder_decoder"]], "model_type": MODEL_TYPE, **bl.config_fields(config)}
    hf.update(bos_token_id=None, forced_bos_token_id=None)
    return hf


def write(state: dict[str, Tensor], config: ModelConfig, kind: str,
          task: TaskConfig | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json dict, tensors)`` of the ``BartForConditionalGeneration`` checkpoint (the
    tied table stored once, as ``model.shared``)."""
    hf = config_to_hf(config, kind, task)
    plan = _plan(config)
    return hf, {**tensors_from_plan(state, plan), bl.LOGITS_BIAS: bl.bias_out(state, plan.dims["W"])}
