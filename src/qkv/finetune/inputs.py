"""Inputs of ``qkv predict``, and a fine-tuned model with its tokenizer and task settings."""

from __future__ import annotations

import json
import os
from pathlib import Path

from qkv.data.tokenizer_facade import TokenizerView, no_tokenizer
from qkv.finetune.examples import FinetuneDataError
from qkv.errors import CheckpointError
from qkv.checkpoints.io import Pretrained, load
from qkv.data.errors import CorpusError
from qkv.data.readers import iter_records, read_records, record_format
from qkv.finetune.examples import read_conll

__all__ = ["load_task_model", "read_inputs"]

def load_task_model(folder):
    """``(model, tokenizer view, settings)`` of a fine-tuning run or any folder with a task head.

    Args:
        folder: the folder, or a :class:`~qkv.checkpoints.io.Pretrained` (``qkv.load(folder)``) whose
            model has a task head.

    ``settings``: ``task``, ``labels``, ``label_kind``, ``max_len``, ``stride``, ``truncate`` — from the
    run's ``run.json`` when there is one, else from the head (windows of 128 tokens, or the model's
    window if shorter, stride ¾ of a window).

    Raises:
        FinetuneDataError: not a loadable folder, no task head, or no tokenizer.
    """
    if isinstance(folder, Pretrained):
        (model, tok), folder = folder, None
        where = "the model"
    elif not isinstance(folder, (str, os.PathLike)):
        raise FinetuneDataError(f"expected a run or model folder, or what qkv.load returns, got "
                                f"{type(folder).__name__}; pass qkv.load(folder) or the folder")
    else:
        folder = Path(folder)
        where = f"model folder {folder}"
        try:
            model, tok = load(folder)
        except CheckpointError as e:
            raise FinetuneDataError(f"cannot load {folder}: {e}") from None
    task = getattr(model, "task", None)
    if task is None:
        raise FinetuneDataError(f"{folder or 'the model'}: the model has no task head (it is a "
                                f"{type(model).__name__}); fine-tune it first: qkv finetune {folder or 'MODEL'} "
                                "--task … --train … --out RUN")
    if tok is None:
        raise no_tokenizer(where, error=FinetuneDataError)
    run = folder / "run.json" if folder is not None else None
    settings = None
    if run is not None and run.is_file():
        meta = json.loads(run.read_text(encoding="utf-8"))
        settings = meta.get("finetune")
    if not isinstance(settings, dict):
        window = min(128, model.config.max_len)
        settings = {"task": task.task, "labels": list(task.labels), "label_kind": "str", "max_len": window,
                    "stride": max(1, 3 * (window - 2) // 4), "truncate": False}
    return model.eval(), TokenizerView(tok, error=FinetuneDataError), settings


def read_inputs(spec: str, task: str, *, text_field: str = "text", tokens_field: str = "tokens",
                encoding_errors: str = "strict"):
    """``(ids, inputs)``: texts (sequence models) or word lists (token models) of ``spec``.

    A ``.jsonl``/``.csv``/``.tsv`` file gives its ``text_field`` (or ``tokens_field``) and its ``id``
    field when present (else the line number); a CoNLL file (token models) gives its sentences; any
    other file is plain text, one input per non-blank line (all read by :mod:`qkv.data.readers`,
    except CoNLL).
    """
    path = Path(spec)
    if not path.is_file():
        raise FinetuneDataError(f"{spec}: no such file; give a text file (one input per line), .jsonl, .csv or "
                                ".tsv (or a CoNLL file for a token model)")
    ids, inputs = [], []
    if record_format(path):
        field = tokens_field if task == "token-classification" else text_field
        try:
            for source, rec in iter_records(path, encoding_errors=encoding_errors):
                if field not in rec:
                    keys = ", ".join(map(repr, list(rec)[:12]))
                    opt = "--tokens-field" if task == "token-classification" else "--text-field"
                    raise FinetuneDataError(f"{source}: no field {field!r} (found: {keys}); choose it with {opt}")
                value = rec[field]
                if task == "token-classification":
                    if not isinstance(value, list) or not value or not all(isinstance(w, str) and w for w in value):
                        raise FinetuneDataError(f"{source}: {field!r} must be a non-empty list of words")
                elif not isinstance(value, str) or not value.strip():
                    raise FinetuneDataError(f"{source}: {field!r} must be a non-empty string")
                ids.append(rec.get("id", source.rsplit(":", 1)[-1]))
                inputs.append(value if task == "token-classification" else value.strip())
        except CorpusError as e:
            raise FinetuneDataError(str(e)) from None
    elif task == "token-classification":
        ex = read_conll(path, encoding_errors, with_tags=False)
        ids, inputs = [s.rsplit(":", 1)[-1] for s in ex.sources], ex.inputs
    else:
        try:
            for line_no, line in read_records(path, fmt="text", encoding_errors=encoding_errors):
                if line.strip():
                    ids.append(line_no)
                    inputs.append(line.strip())
        except CorpusError as e:
            raise FinetuneDataError(str(e)) from None
    return ids, inputs
