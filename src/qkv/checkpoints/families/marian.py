"""Hugging Face Marian ⇄ qkv (``model_type: marian``; ``MarianMTModel``, the opus-mt translation models).

Legend: C ``d_model``, V ``vocab_size``, W ``decoder_vocab_size`` (= V when the vocabularies are shared).

Marian is a post-LN encoder–decoder, qkv's :class:`~qkv.models.seq2seq.EncoderDecoder` (kind
``"encoder_decoder"``) with fixed sinusoidal positions laid out sines-then-cosines (position
``sinusoidal-halves``; not stored in the checkpoint: computed), token embeddings scaled by √C when
``scale_embedding``, no norm on the embedding sum, no final norms, and a ``final_logits_bias``
(``ModelConfig.decoder.logits_bias``). The layers' names are :mod:`._bart_like`'s. Embeddings:

* shared vocabularies (``share_encoder_decoder_embeddings: true``): ``model.shared`` →
  ``encoder.embeddings.tokens`` (the decoder reads it: one table); ``model.encoder.embed_tokens``
  and ``model.decoder.embed_tokens``, when stored, must equal it;
* separate vocabularies (``false``): ``model.encoder.embed_tokens`` → ``encoder.embeddings.tokens``,
  ``model.decoder.embed_tokens (W,C)`` → ``decoder.embeddings.tokens`` (``decoder.vocab_size``);
* ``lm_head`` is tied to the decoder's table; ``embed_positions``, when stored, are ignored (the
  sinusoids are computed).

Config: ``decoder_start_token_id`` (Marian starts from the pad id), ``eos_token_id``,
``pad_token_id``, ``activation_function`` (``swish`` → ``silu``, ``gelu``, ``relu``), ``dropout``,
``attention_dropout``; ``activation_dropout`` (dropout inside the feed-forward while training) is
accepted and not kept — qkv's feed-forward has none; it changes no output. Refused: encoder and
decoder of different heads or feed-forward widths, ``normalize_before``, layer drop.
Generation options (``num_beams``, ``bad_words_ids``, ``forced_eos_token_id`` …) are not part of
the model: pass them to :func:`qkv.generation.seq2seq.decode`.

Written: ``MarianMTModel`` from kind ``"encoder_decoder"`` (the model's family ``marian``, or any
qkv encoder–decoder the format can express; every option it cannot is refused by name).
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

MODEL_TYPE = "marian"
NAME = "Marian"
ARCHITECTURES = {"encoder_decoder": "MarianMTModel"}
SUPPORTED = "MarianMTModel (an encoder-decoder with its tied LM head)"
_TABLES = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")


def _shared(config: ModelConfig) -> bool:
    return config.decoder is None or config.decoder.vocab_size is None


def _plan(config: ModelConfig) -> bl.Plan:
    plan = bl.base_plan(config, config.max_len)
    if _shared(config):
        plan.rows.append(("model.shared.weight", "encoder.embeddings.tokens.weight", "VC"))
    else:
        plan.rows += [("model.encoder.embed_tokens.weight", "encoder.embeddings.tokens.weight", "VC"),
                      ("model.decoder.embed_tokens.weight", "decoder.embeddings.tokens.weight", "WC")]
    return plan


def _config(hf: dict[str, Any], source: str) -> ModelConfig:
    if hf.get("normalize_before", False):
        raise CheckpointError(f"{source}: normalize_before=true (pre-LN Marian) is not supported; qkv reads the "
                              "post-LN Marian of transformers' MarianMTModel")
    fields = bl.model_fields(hf, source)
    if not hf.get("share_encoder_decoder_embeddings", True):
        fields["decoder"]["vocab_size"] = hf.get("decoder_vocab_size") or hf["vocab_size"]
    try:
        return ModelConfig.from_flat(**fields, position="sinusoidal-halves", embedding_norm=False, family=MODEL_TYPE)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{source}: {e}") from e


def read(hf: dict[str, Any], tensors: dict[str, Tensor], *, config_source: str, weights_source: str) -> Imported:
    """A ``MarianMTModel`` checkpoint as qkv's config, kind ``"encoder_decoder"`` and state dict.

    Raises:
        CheckpointError: another architecture, a missing, mis-shaped, unexpected or unknown tensor,
            an untied head, a config option qkv does not support.
    """
    archs = architectures(hf)
    if archs and archs != ["MarianMTModel"]:
        raise CheckpointError(f"{config_source}: architectures={archs!r} is not supported; qkv loads {SUPPORTED}")
    config = _config(hf, config_source)
    plan = _plan(config)
    positions = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
    check_plan(tensors, plan, weights_source, ignored=positions + _TABLES + (bl.LM_HEAD, bl.LOGITS_BIAS),
               owned=("model.",), layers_field="encoder_layers/decoder_layers", n_layers=config.n_layers,
               unknown=f"a Marian model ({SUPPORTED})")
    if _shared(config):
        for name in _TABLES[1:]:
            check_tied(tensors, name, "model.shared.weight", weights_source, what="model.shared.weight")
    table = "model.shared.weight" if _shared(config) else "model.decoder.embed_tokens.weight"
    bl.check_head(tensors, table, weights_source)
    state = state_from_plan(tensors, plan)
    state["logits_bias"] = bl.bias_in(tensors, plan.dims["W"], weights_source)
    return Imported(config, "encoder_decoder", None, state)


def config_to_hf(config: ModelConfig, kind: str, task: TaskConfig | None = None) -> dict[str, Any]:
    """The ``config.json`` of ``MarianMTModel``; raises :class:`CheckpointError` naming every option
    Marian cannot express."""
    extra = [] if kind == "encoder_decoder" else [f"kind {kind!r} (Marian is an encoder-decoder)"]
    dec = config.decoder
    if dec is not None and dec.output_scale != 1.0:
        extra.append(f"decoder.output_scale={dec.output_scale} (Marian needs 1.0)")
    refuse_unexpressible(config, NAME, {**bl.NEEDS, "position": "sinusoidal-halves", "embedding_norm": False,
                                        "position_offset": 0}, extra)
    shared = _shared(config)
    return {"architectures": [ARCHITECTURES["encoder_decoder"]], "model_type": MODEL_TYPE, **bl.config_fields(config),
            "decoder_vocab_size": config.vocab_size if shared else dec.vocab_size,
            "share_encoder_decoder_embeddings": shared, "normalize_before": False}


def write(state: dict[str, Tensor], config: ModelConfig, kind: str,
          task: TaskConfig | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json dict, tensors)`` of the ``MarianMTModel`` checkpoint (tied tables stored once,
    positions not stored: transformers computes them)."""
    hf = config_to_hf(config, kind, task)
    plan = _plan(config)
    return hf, {**tensors_from_plan(state, plan), bl.LOGITS_BIAS: bl.bias_out(state, plan.dims["W"])}
