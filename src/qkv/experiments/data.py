"""The data every variant shares: one held-out text, one tokenizer, tokenised once.

``prepare_shared_data`` runs once per harness folder, before any training:

* **held-out text** — ``--eval-corpus`` if given, else the named ``test`` split of a named data
  set; else the corpus is split once (``eval_fraction``, split seed 0 whatever the training seeds)
  and both parts are written to ``OUT/data/{train,eval}.jsonl``, so that every variant *and every
  seed* is evaluated on the same documents (``qkv pretrain`` alone would split with the run's seed);
* **tokenizer** — trained once on the training text into ``OUT/tokenizer/`` and handed to every run;
* **token caches** — built once, so parallel runs only read them.

``OUT/shared.json`` records the inputs and the result; a rerun with the same inputs reuses them,
one with different inputs is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qkv.experiments.grid import DATA_FIELDS
from qkv._fs import atomic_file, atomic_write_text, write_folder
from qkv.data.corpus import CorpusOptions
from qkv.data.corpus import Corpus, train_eval_corpora
from qkv.data.pipeline import prepare_pretraining_data
from qkv.data.tokenizer import train_tokenizer

__all__ = ["prepare_shared_data", "corpus_options"]

SHARED_JSON = "shared.json"


def corpus_options(fields: dict[str, Any]):
    """The :class:`~qkv.data.corpus.CorpusOptions` of TrainConfig-style ``fields``."""
    return CorpusOptions(**{k: fields[k] for k in ("doc_sep", "text_field", "encoding_errors",
                                                   "max_doc_bytes", "long_docs")})


def _write_jsonl(path: Path, texts) -> int:
    n = 0
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
            n += 1
    return n


def prepare_shared_data(out: Path, corpus: tuple[str, ...], eval_corpus: tuple[str, ...] | None,
                        fields: dict[str, Any], *, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Make (or reuse) the shared held-out text, tokenizer and caches under ``out``.

    Args:
        out: the harness folder.
        corpus, eval_corpus: the command line's corpus specs.
        fields: TrainConfig fields with every key of :data:`DATA_FIELDS` (defaults filled in).

    Returns:
        ``{"data_fields": {...}, "how": str}``: the TrainConfig fields every run gets (``corpus``,
        ``eval_corpus``, ``tokenizer`` and the reading options) and how the held-out text was chosen.

    Raises:
        ValueError: the folder was prepared from other inputs; and every corpus or tokenizer error
            of :mod:`qkv.data` (a subclass of ``ValueError``).
    """
    out = Path(out)
    inputs = {"corpus": list(corpus), "eval_corpus": list(eval_corpus) if eval_corpus else None,
              **{k: fields[k] for k in DATA_FIELDS}}
    record_path = out / SHARED_JSON
    if record_path.is_file():
        record = json.loads(record_path.read_text(encoding="utf-8"))
        if record["inputs"] != inputs:
            diff = [f"{k}: {record['inputs'].get(k)!r} → {v!r}" for k, v in inputs.items()
                    if record["inputs"].get(k) != v]
            raise ValueError(f"{out} was prepared from other data inputs: " + "; ".join(diff)
                             + "; use the same corpus options or another --out")
        if Path(record["data_fields"]["tokenizer"], "tokenizer.json").is_file():
            return {"data_fields": record["data_fields"], "how": record["how"]}
    out.mkdir(parents=True, exist_ok=True)
    options = corpus_options(fields)
    te = train_eval_corpora(list(corpus), options, eval_fraction=fields["eval_fraction"], seed=0,
                            eval_specs=list(eval_corpus) if eval_corpus else None)
    data_fields: dict[str, Any] = {k: fields[k] for k in DATA_FIELDS}
    if eval_corpus is None and not te.how.startswith("named split"):
        folder = out / "data"
        folder.mkdir(exist_ok=True)
        log(f"splitting {', '.join(corpus)} once ({te.how}) into {folder}/train.jsonl, eval.jsonl")
        n_train = _write_jsonl(folder / "train.jsonl", te.train.texts())
        n_eval = _write_jsonl(folder / "eval.jsonl", te.eval.texts())
        how = f"{te.how}: {n_eval} documents held out, {n_train} for training (same for every seed)"
        data_fields.update(corpus=[str(folder / "train.jsonl")], eval_corpus=[str(folder / "eval.jsonl")],
                           text_field="text")
        train_text = Corpus([str(folder / "train.jsonl")], corpus_options(data_fields))
    else:
        how = te.how
        data_fields.update(corpus=list(corpus), eval_corpus=list(eval_corpus) if eval_corpus else None)
        train_text = te.train
    log(f"training the shared tokenizer (vocab {fields['vocab_size']}) on the training text")
    tok = train_tokenizer(train_text, vocab_size=fields["vocab_size"], lowercase=fields["lowercase"])
    tok_dir = out / "tokenizer"

    def same_file(e: OSError) -> bool:  # another harness process on this folder got there first
        return (tok_dir / "tokenizer.json").is_file()  # same inputs, same file

    with write_folder(tok_dir, on_conflict=same_file) as tmp:  # replaces one left by an interrupted run
        tok.save(tmp)
    data_fields["tokenizer"] = str(tok_dir)
    log("tokenising the training and held-out text once (token caches)")
    prepare_pretraining_data(data_fields["corpus"], options=corpus_options(data_fields),
                             eval_corpus=data_fields["eval_corpus"], eval_fraction=fields["eval_fraction"],
                             seed=0, tokenizer=tok, max_len=8)
    atomic_write_text(record_path, json.dumps({"inputs": inputs, "data_fields": data_fields, "how": how},
                                              indent=2))
    return {"data_fields": data_fields, "how": how}
