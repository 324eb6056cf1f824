"""Converting a checkpoint folder between formats: :func:`convert` (``qkv convert SRC DST``)."""

from __future__ import annotations

import os
from pathlib import Path

from qkv.checkpoints.io import MODEL_FILES, QKV_CONFIG, export_hf, is_model_folder, load, save
from qkv.checkpoints.st_folder import convert_to_st
from qkv.errors import CheckpointError
from qkv.validation import check_choice

__all__ = ["convert"]


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, to: str | None = None, options=None) -> Path:
    """Convert a checkpoint folder: Hugging Face (BERT, RoBERTa, DistilBERT, ELECTRA, ModernBERT, GPT-2)
    → qkv, qkv → Hugging Face as the family the model came from (BERT for a qkv model; see
    :func:`export_hf`), or either → sentence-transformers.

    Args:
        src: a qkv or Hugging Face folder.
        dst: the folder to write.
        to: ``"qkv"``, ``"hf"`` or ``"sentence-transformers"`` (a folder
            ``sentence_transformers.SentenceTransformer`` loads; see :mod:`qkv.checkpoints.st_folder`);
            default: the other format than ``src``'s.
        options: for ``"sentence-transformers"`` only: the
            :class:`~qkv.embeddings.options.EmbedOptions` (pooling, normalize, max_len) the folder
            declares; unset ones come from ``src``'s declared settings, else mean, normalised, the
            model's window.
    """
    check_choice("to", to, ("qkv", "hf", "sentence-transformers"), optional=True)
    if to == "sentence-transformers":
        return convert_to_st(src, dst, options)
    if options is not None:
        raise ValueError("options= are the embedding settings of a sentence-transformers folder; "
                         "pass to='sentence-transformers' or leave options out")
    if to is None:
        to = "hf" if (Path(src) / QKV_CONFIG).is_file() else "qkv"
    dst_path = Path(dst)
    if dst_path.exists() and not dst_path.is_dir():
        raise CheckpointError(f"{dst}: exists and is not a folder; choose another destination")
    if dst_path.is_dir() and not is_model_folder(dst_path):
        extra = sorted(p.name for p in dst_path.iterdir() if p.name not in MODEL_FILES and not p.name.startswith("."))
        raise CheckpointError(f"{dst}: holds files that are not part of a model ({', '.join(extra[:5])}); "
                              "convert replaces the destination as a whole: choose an empty or model-only folder")
    pretrained = load(src)
    return export_hf(pretrained, dst) if to == "hf" else save(pretrained, dst)
