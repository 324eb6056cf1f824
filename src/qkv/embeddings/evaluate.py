"""Evaluation of document embeddings against a TF-IDF baseline on a labelled train/test split.

Metrics, all on the test split (N_test documents):

* **k-NN accuracy**: each test document takes the majority label of its k most cosine-similar
  *train* documents (ties go to the label with the larger summed similarity).
* **logistic-regression accuracy**: scikit-learn ``LogisticRegression`` (C = 10, lbfgs, up to
  2000 iterations) trained on the train split's vectors, scored on the test split's.
* **retrieval MAP**: each test document queries the other test documents ranked by cosine; the
  relevant ones share its label; mean over queries of the average precision.

The TF-IDF baseline (scikit-learn ``TfidfVectorizer``: sublinear tf, English stop words, min_df 2,
fitted on the train split; rows L2-normalised) runs in the same call on the same documents.

Datasets: ``reuters8``, ``20newsgroups`` (or another labelled named dataset with train and test
splits; test documents whose text also occurs in train are dropped), or a labelled file read by
:func:`qkv.data.readers.iter_records` — JSONL, CSV or TSV (a header row naming the columns),
optionally gzip-compressed — with ``text`` and ``label`` fields and an optional ``split`` field
(``train``/``test``); documents without one are split by seed, 25 % test.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.options import VECTOR_FIELDS, EmbedOptions, as_options
from qkv.data.errors import CorpusError
from qkv.data.readers import iter_records
from qkv.data.corpus import Corpus
from qkv.data.datasets import DATASETS
from qkv.data.readers import record_format
from qkv.embeddings.embedder import Embedder

__all__ = ["EvalData", "load_eval_data", "score", "tfidf_vectors", "evaluate_models", "format_table"]

LOGREG_C = 10.0


@dataclass
class EvalData:
    """A labelled train/test split, possibly subsampled (``notes`` say how)."""

    name: str
    train_texts: list[str]
    train_labels: list[str]
    test_texts: list[str]
    test_labels: list[str]
    notes: list[str] = field(default_factory=list)


def subsample(texts, labels, n, seed, what, notes):
    if n is None or n >= len(texts):
        return texts, labels
    keep = np.sort(np.random.default_rng(seed).choice(len(texts), size=n, replace=False))
    notes.append(f"{what}: seeded random subsample of {n} of {len(texts)} documents (seed {seed})")
    return [texts[i] for i in keep], [labels[i] for i in keep]


def _file_split(path: Path, seed: int, text_field: str, label_field: str):
    rows: dict[str, tuple[list, list]] = {"train": ([], []), "test": ([], []), "": ([], [])}
    try:
        for source, obj in iter_records(path):
            if text_field not in obj or label_field not in obj:
                raise EmbeddingError(f"{source}: expected the fields {text_field!r} and {label_field!r} "
                                     "(and optionally 'split': train|test)")
            split = str(obj.get("split") or "")
            if split not in rows:
                raise EmbeddingError(f"{source}: split {split!r}; allowed: train, test (or none)")
            label = obj[label_field]
            if label is None or label == "" or isinstance(label, (list, dict)):
                raise EmbeddingError(f"{source}: the {label_field!r} field is {label!r}; every document needs a "
                                     "label (a string or a number)")
            rows[split][0].append(str(obj[text_field]))
            rows[split][1].append(str(label))
    except CorpusError as e:
        raise EmbeddingError(str(e)) from None
    notes = []
    loose_texts, loose_labels = rows[""]
    if loose_texts:
        order = np.random.default_rng(seed).permutation(len(loose_texts))
        n_test = max(1, round(0.25 * len(order)))
        for part, idx in (("test", order[:n_test]), ("train", order[n_test:])):
            rows[part][0].extend(loose_texts[i] for i in sorted(idx))
            rows[part][1].extend(loose_labels[i] for i in sorted(idx))
        notes.append(f"{len(loose_texts)} documents without a split field: seeded 25 % test split "
                     f"(seed {seed})")
    return rows["train"], rows["test"], notes


def load_eval_data(dataset: str, *, max_train: int | None = None, max_test: int | None = None,
                   seed: int = 0, text_field: str = "text", label_field: str = "label") -> EvalData:
    """The train and test documents of ``dataset``: a named dataset, or a labelled ``.jsonl``,
    ``.csv`` or ``.tsv`` file (optionally ``.gz``) with ``text_field``, ``label_field`` and
    optionally ``split`` (``train``/``test``; documents without one: a seeded 25 % test split).

    Raises:
        EmbeddingError: unknown dataset, unlabelled data, a split with fewer than 2 documents, a
            malformed file (names the file and line).
    """
    path = Path(dataset)
    notes: list[str] = []
    if dataset in DATASETS:
        info = DATASETS[dataset]
        if not info.labelled or "test" not in info.splits:
            raise EmbeddingError(f"dataset {dataset!r} has no labelled train/test split; use reuters8, "
                                 "20newsgroups or reuters52")
        try:
            train = Corpus(f"dataset:{dataset}:train")
            (tr_t, tr_l) = train.labelled()
            (te_t, te_l) = Corpus(f"dataset:{dataset}:test").excluding(train).labelled()
        except CorpusError as e:
            raise EmbeddingError(str(e)) from e
        name = dataset
    elif record_format(path) is not None and path.is_file():
        (tr_t, tr_l), (te_t, te_l), notes = _file_split(path, seed, text_field, label_field)
        name = path.name
    else:
        missing = " (no such file)" if record_format(path) is not None else ""
        raise EmbeddingError(f"unknown dataset {dataset!r}{missing}: give reuters8, 20newsgroups, reuters52 or a "
                             "labelled file (.jsonl, .csv or .tsv, optionally .gz) with text and label "
                             "fields and optionally split (train|test)")
    tr_t, tr_l = subsample(tr_t, tr_l, max_train, seed, "train", notes)
    te_t, te_l = subsample(te_t, te_l, max_test, seed + 1, "test", notes)
    if len(tr_t) < 2 or len(te_t) < 2:
        raise EmbeddingError(f"{name}: need at least 2 train and 2 test documents, got "
                             f"{len(tr_t)} / {len(te_t)}")
    return EvalData(name, tr_t, tr_l, te_t, te_l, notes)


def _similarity_blocks(queries, keys, block: int = 512):
    """Yield ``(start, (b,N_keys) cosine block)``; rows of both inputs are L2-normalised."""
    for i in range(0, queries.shape[0], block):
        sims = queries[i:i + block] @ keys.T
        yield i, (sims.toarray() if hasattr(sims, "toarray") else np.asarray(sims))


def knn_accuracy(train, train_y: np.ndarray, test, test_y: np.ndarray, k: int) -> float:
    k = min(k, train.shape[0])
    n_classes = int(max(train_y.max(), test_y.max())) + 1
    correct = 0
    for i, sims in _similarity_blocks(test, train):
        top = np.argpartition(-sims, k - 1, axis=1)[:, :k]  # (b,k)
        votes = np.zeros((len(sims), n_classes))
        score = np.zeros((len(sims), n_classes))
        rows = np.arange(len(sims))[:, None]
        np.add.at(votes, (rows, train_y[top]), 1.0)
        np.add.at(score, (rows, train_y[top]), sims[rows, top])
        pred = np.argmax(votes * 1e6 + score, axis=1)  # majority, then summed similarity
        correct += int((pred == test_y[i:i + len(sims)]).sum())
    return correct / len(test_y)


def retrieval_map(test, test_y: np.ndarray) -> float:
    aps = []
    for i, sims in _similarity_blocks(test, test):
        rows = np.arange(len(sims))
        sims[rows, i + rows] = -np.inf  # a document never retrieves itself
        order = np.argsort(-sims, axis=1, kind="stable")[:, :-1]  # (b,N-1): self is last
        rel = test_y[order] == test_y[i + rows][:, None]  # (b,N-1)
        hits = np.cumsum(rel, axis=1)
        prec = hits / np.arange(1, rel.shape[1] + 1)
        n_rel = rel.sum(axis=1)
        ap = np.where(n_rel > 0, (prec * rel).sum(axis=1) / np.maximum(n_rel, 1), 0.0)
        aps.extend(ap.tolist())
    return float(np.mean(aps))


def score(train, train_labels, test, test_labels, *, k: int = 10) -> dict[str, float]:
    """k-NN accuracy, logistic-regression accuracy and MAP of vectors (dense or sparse, rows unit-norm)."""
    # lazy: scikit-learn takes 1.0–1.4 s to import (python -X importtime); only the baselines need it
    # lazy: scikit-learn takes 1.0–1.4 s to import (python -X importtime); only the baselines need it
    from sklearn.linear_model import LogisticRegression

    names = sorted(set(train_labels) | set(test_labels))
    tr_y = np.asarray([names.index(x) for x in train_labels])
    te_y = np.asarray([names.index(x) for x in test_labels])
    clf = LogisticRegression(C=LOGREG_C, max_iter=2000).fit(train, tr_y)
    return {"knn_accuracy": knn_accuracy(train, tr_y, test, te_y, k),
            "logreg_accuracy": float((clf.predict(test) == te_y).mean()),
            "map": retrieval_map(test, te_y)}


def tfidf_vectors(data: EvalData):
    # lazy: scikit-learn takes 1.0–1.4 s to import (python -X importtime); only the baselines need it
    from sklearn.feature_extraction.text import TfidfVectorizer

    vec = TfidfVectorizer(sublinear_tf=True, stop_words="english", min_df=2)
    return vec.fit_transform(data.train_texts), vec.transform(data.test_texts)


def evaluate_models(models: list[str], data: EvalData, *, k: int = 10, options: EmbedOptions | None = None,
                    log=print, **changes) -> dict[str, Any]:
    """TF-IDF and each model folder on ``data``.

    Args:
        models: the model folders.
        data: the labelled split (see :func:`load_eval_data`).
        k: neighbours for k-NN.
        options: the :class:`~qkv.embeddings.options.EmbedOptions` of every model (default
            ``EmbedOptions(empty="zero")``: an empty document is a zero vector); ``normalize`` is
            forced on.
        log: called with a line as each model is done.
        **changes: options changed on top of ``options``, by name (``max_len=128``, ``device="cuda"`` …).

    Returns:
        The JSON-ready result; each model's row records its resolved options
        (:data:`~qkv.embeddings.options.VECTOR_FIELDS`).

    Raises:
        EmbeddingError: a bad option or model.
    """
    options = as_options(options, default=EmbedOptions(empty="zero"), **changes).replace(normalize=True)
    rows = []
    t0 = time.perf_counter()
    tr, te = tfidf_vectors(data)
    rows.append({"model": "TF-IDF", **score(tr, data.train_labels, te, data.test_labels, k=k),
                 "seconds": round(time.perf_counter() - t0, 1), "options": {"vocabulary": tr.shape[1]}})
    log(f"TF-IDF done ({rows[-1]['seconds']} s)")
    for model in models:
        t0 = time.perf_counter()
        emb = Embedder(model, options)
        tr, te = emb.embed(data.train_texts), emb.embed(data.test_texts)
        rows.append({"model": str(model), **score(tr, data.train_labels, te, data.test_labels, k=k),
                     "seconds": round(time.perf_counter() - t0, 1),
                     "options": {**emb.options.to_dict(VECTOR_FIELDS),
                                 "long_documents": emb.stats.long_documents, "windows": emb.stats.windows}})
        log(f"{model} done ({rows[-1]['seconds']} s)")
    return {"dataset": data.name, "train_documents": len(data.train_texts),
            "test_documents": len(data.test_texts), "notes": data.notes, "k": k, "logreg_C": LOGREG_C,
            "results": rows}


def format_table(result: dict[str, Any]) -> str:
    """A Markdown table of :func:`evaluate_models`' result, with its notes."""
    lines = [f"{result['dataset']}: test split {result['test_documents']} documents, train split "
             f"{result['train_documents']}; k-NN k={result['k']}, logistic regression C={result['logreg_C']}",
             *(f"  note: {n}" for n in result["notes"]), "",
             "| model | k-NN acc | LogReg acc | MAP | seconds |", "|---|---|---|---|---|"]
    for r in result["results"]:
        lines.append(f"| {r['model']} | {r['knn_accuracy']:.4f} | {r['logreg_accuracy']:.4f} | "
                     f"{r['map']:.4f} | {r['seconds']} |")
    return "\n".join(lines)
