"""Content fingerprints of a run: what ``--resume`` checks before it continues.

A run's ``run.json`` holds, from its first start,

* ``run_id``: a random id; every checkpoint's ``trainer.json`` repeats it, so weights of another
  run dropped into the folder are refused;
* ``fingerprints``: the content fingerprints of the training and held-out corpora (the raw bytes
  and read options, :meth:`qkv.data.corpus.Corpus.fingerprint`) and of the tokenizer.

Every checkpoint's ``trainer.json`` also holds the sha256 of ``model.safetensors`` and
``optimizer.pt`` written at save time (:mod:`qkv.training.checkpoint`), and the token cache's
``meta.json`` holds the sha256 of its arrays (:mod:`qkv.data.cache`). A resume therefore continues
only on the same data, tokens and state the run was interrupted with — or says which differs.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from qkv.training.rundir import RunError

__all__ = ["new_run_id", "data_fingerprints", "check_data_fingerprints"]


def new_run_id() -> str:
    """A fresh random run id."""
    return uuid.uuid4().hex


def data_fingerprints(data) -> dict[str, str]:
    """``{"train_corpus", "eval_corpus", "tokenizer"}`` fingerprints of prepared pretraining data."""
    return {"train_corpus": data.train_cache.meta["corpus_fingerprint"],
            "eval_corpus": data.eval_cache.meta["corpus_fingerprint"],
            "tokenizer": data.tokenizer.fingerprint()}


def check_data_fingerprints(meta: dict, data, out: Path) -> None:
    """Refuse a resume whose corpus or tokenizer differ from the run's (runs without stored
    fingerprints, made by older qkv versions, are not checked).

    Raises:
        RunError: naming what changed and what to do.
    """
    stored = meta.get("fingerprints")
    if not isinstance(stored, dict):
        return
    now = data_fingerprints(data)
    what = {"train_corpus": ("the training corpus", data.corpora.train.describe()),
            "eval_corpus": ("the held-out corpus", data.corpora.eval.describe())}
    changed = [f"{what.get(k, (k, ''))[0]} {what.get(k, ('', ''))[1]} ({stored[k][:12]} → {now[k][:12]})"
               for k in now if k in stored and stored[k] != now[k]]
    if changed:
        raise RunError(f"--resume: {out} was trained on other content: " + "; ".join(changed)
                       + ". A resume must see the same bytes to continue bit-identically: restore the "
                       "original files, or start a new run with another --out")
