"""sentence-transformers folders written: a folder that ``sentence_transformers.SentenceTransformer(path)``
loads (offline). Reading the settings such a folder declares is :mod:`qkv.checkpoints.st_settings`.

Writing (:func:`save_st_folder`, :func:`convert_to_st`; ``qkv convert SRC DST --to
sentence-transformers``): the encoder as a Hugging Face ``BertModel`` (:func:`qkv.export_hf`), its
tokenizer, ``modules.json``, ``1_Pooling/config.json`` (``pooling_mode`` as sentence-transformers 6
writes it), ``2_Normalize`` when normalising, ``sentence_bert_config.json`` (``max_seq_length`` =
the window, ``do_lower_case`` false; ``add_pooling_layer`` false for an encoder without pooler) and
``config_sentence_transformers.json``; assembled aside and
swapped into place (:mod:`qkv._fs`). ``SentenceTransformer(path).encode(texts)`` then equals
``qkv.embed(path, texts)`` for texts within the window (sentence-transformers cuts longer texts to
the window; qkv averages windows unless ``truncate``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import processors

from qkv import __version__
from qkv._fs import write_folder
from qkv.checkpoints import families
from qkv.checkpoints.io import MODEL_FILES, export_hf, unpack
from qkv.checkpoints.st_settings import (BERT_CONFIG, MODULES_JSON, NORMALIZE_DIR, POOLING_DIR, QKV_TO_ST, ST_CONFIG,
                                        ST_FILES)
from qkv.data.model_tokenizer import ModelTokenizer
from qkv.data.tokenizer_facade import TokenizerView
from qkv.embeddings.embedder import resolve_model
from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.options import as_options
from qkv.embeddings.pooling import pooling_modes
from qkv.errors import CheckpointError
from qkv.models.kinds import encoder_of

__all__ = ["save_st_folder", "convert_to_st"]

def save_st_folder(model, dst: str | os.PathLike, options, *, tokenizer=None,
                   extra: dict | None = None) -> Path:
    """Write a folder ``SentenceTransformer(dst)`` loads (see the module docstring). Atomic.

    Args:
        model: a qkv :class:`~qkv.nn.encoder.Encoder`, a model holding one (``MaskedLM``, a task
            model), or a :class:`~qkv.checkpoints.io.Pretrained`.
        dst: the folder: missing, empty, or a model / sentence-transformers folder (replaced as a
            whole); a folder holding anything else is refused.
        options: resolved :class:`~qkv.embeddings.options.EmbedOptions` (pooling, normalize,
            max_len, layers set; see :meth:`~qkv.embeddings.options.EmbedOptions.resolved`).
        tokenizer: replaces the bundle's.
        extra: more JSON files to write at the top, by name (e.g. ``embedding.json``).

    Raises:
        EmbeddingError: ``layers`` other than the last (sentence-transformers pools the last layer),
            a model BERT cannot express, no tokenizer, or a destination holding other files.
    """

    model, tokenizer = unpack(model, tokenizer)
    encoder = encoder_of(model)
    if tokenizer is None:
        raise EmbeddingError("a sentence-transformers folder needs the tokenizer: give a model folder that holds "
                             "one (tokenizer.json or vocab.txt; in Python: pass tokenizer=)")
    if tuple(options.layers) != (len(encoder.layers),):
        raise EmbeddingError(f"layers={list(options.layers)}: sentence-transformers pools the last layer "
                             "only; convert with the default layers (-1)")
    dst = _check_destination(Path(dst))
    width = encoder.config.d_model
    modes = pooling_modes(options.pooling)
    st_modes = [QKV_TO_ST[m] for m in modes]
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": POOLING_DIR, "type": "sentence_transformers.models.Pooling"}]
    if options.normalize:
        modules.append({"idx": 2, "name": "2", "path": NORMALIZE_DIR,
                        "type": "sentence_transformers.models.Normalize"})


    # BERT and RoBERTa build a pooler unless told not to; the other families have none to skip
    has_pooler_arg = families.for_export(encoder.config).MODEL_TYPE in ("bert", "roberta")
    no_pooler = {"model_args": {"add_pooling_layer": False}} if has_pooler_arg and not encoder.config.pooler else {}
    files = {MODULES_JSON: modules,
             f"{POOLING_DIR}/config.json": {"embedding_dimension": width,
                                             "pooling_mode": st_modes[0] if len(st_modes) == 1 else st_modes,
                                             "include_prompt": True},
             BERT_CONFIG: {"max_seq_length": options.max_len, "do_lower_case": False,
                            **no_pooler},
             ST_CONFIG: {"__version__": {"qkv": __version__}, "model_type": "SentenceTransformer",
                          "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"},
             **(extra or {})}
    if options.normalize:
        files[f"{NORMALIZE_DIR}/config.json"] = {"module_input_name": "sentence_embedding",
                                                  "module_output_name": "sentence_embedding"}
    tokenizer = _framed(tokenizer)
    with write_folder(dst, how="replace") as tmp:
        try:
            export_hf(encoder, tmp, tokenizer=tokenizer)
        except CheckpointError as e:
            raise EmbeddingError(f"cannot write a sentence-transformers folder: {e}") from e
        for name, data in files.items():
            (tmp / name).parent.mkdir(exist_ok=True)
            (tmp / name).write_text(json.dumps(data, indent=2), encoding="utf-8")
    return dst


def _framed(tokenizer):
    """A copy of ``tokenizer`` that adds the special tokens qkv puts around every window (its own
    post-processor's; ``[CLS] … [SEP]`` for a BERT vocabulary without one) and neither truncates
    nor pads (sentence-transformers sets both). The special tokens the folder declared travel with
    it."""
    view = TokenizerView(tokenizer, error=EmbeddingError)
    out = view.backend
    if out.post_processor is None and (view.prefix or view.suffix):
        prefix = [(view.id_to_token(i), i) for i in view.prefix]
        suffix = [(view.id_to_token(i), i) for i in view.suffix]
        out.post_processor = processors.TemplateProcessing(
            single=" ".join([t for t, _ in prefix] + ["$A"] + [t for t, _ in suffix]),
            special_tokens=list(dict(prefix + suffix).items()))
    return ModelTokenizer(out, dict(view.specials.declared))


def _check_destination(dst: Path) -> Path:

    if dst.exists() and not dst.is_dir():
        raise EmbeddingError(f"{dst}: exists and is not a folder; choose another destination")
    if dst.is_dir():
        extra = sorted(p.name for p in dst.iterdir()
                       if p.name not in MODEL_FILES | ST_FILES and not p.name.startswith("."))
        if extra:
            raise EmbeddingError(f"{dst}: holds files that are not part of a model ({', '.join(extra[:5])}); "
                                 "the folder is replaced as a whole: choose an empty or model-only folder")
    return dst


def convert_to_st(src: str | os.PathLike, dst: str | os.PathLike, options=None) -> Path:
    """``qkv convert SRC DST --to sentence-transformers``: read ``src`` (a qkv, Hugging Face BERT or
    sentence-transformers folder) and write ``dst`` with :func:`save_st_folder`.

    Args:
        options: :class:`~qkv.embeddings.options.EmbedOptions`; unset fields come from ``src``'s
            declared settings (:func:`~qkv.embeddings.options.folder_defaults`), else mean pooling,
            normalised, the model's window.

    Raises:
        EmbeddingError: see :func:`save_st_folder`; a source that cannot be loaded.
    """

    options = as_options(options)
    encoder, view, folder, _ = resolve_model(src)
    limit = encoder.max_len
    resolved = options.with_folder_defaults(folder, max_positions=limit).resolved(
        n_layers=len(encoder.layers), max_positions=limit)
    return save_st_folder(encoder, dst, resolved, tokenizer=view.backend)

