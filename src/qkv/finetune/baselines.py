"""The baselines a fine-tuning report is read against, trained and scored on the same split.

* ``tfidf``: scikit-learn ``TfidfVectorizer`` (sublinear tf, English stop words, min_df 2, fitted on
  the training texts; as in ``qkv eval-embeddings``) + ``LogisticRegression`` (C = 10, lbfgs, up to
  2000 iterations) — or ``Ridge`` (α = 1) for regression — on whole texts (never truncated).
* ``frozen``: the same classifier (regressor) on the *starting* model's frozen mean-pooled vectors
  (``qkv.embed``: windows as in fine-tuning, averaged over a long text) — what the encoder knows
  before fine-tuning.
* ``word-tag`` (token tasks): each word gets the tag it had most often in training (lower-cased),
  an unseen word the most frequent tag overall.

Each returns the metrics report of :mod:`qkv.finetune.metrics` plus ``seconds`` (and, for
classification, the per-example ``predictions``, which :func:`paired` compares with the model's).
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
from qkv.finetune.metrics import classification_report, regression_report
from qkv.embeddings.embedder import Embedder
from qkv.finetune.metrics import token_report

__all__ = ["tfidf_baseline", "frozen_baseline", "word_tag_baseline", "paired"]

LOGREG_C = 10.0


def _fit_score(x_train, y_train, x_test, y_test, task: str, labels):
    # lazy: scikit-learn takes 1.0–1.4 s to import (python -X importtime); only the baselines need it
    # lazy: scikit-learn takes 1.0–1.4 s to import (python -X importtime); only the baselines need it
    from sklearn.linear_model import LogisticRegression, Ridge

    if task == "regression":
        reg = Ridge(alpha=1.0).fit(x_train, np.asarray(y_train, dtype=np.float64))
        return regression_report(list(map(float, y_test)), [float(v) for v in reg.predict(x_test)])
    clf = LogisticRegression(C=LOGREG_C, max_iter=2000).fit(x_train, np.asarray(y_train))
    pred = [int(v) for v in clf.predict(x_test)]
    return {**classification_report(list(map(int, y_test)), pred, labels), "predictions": pred}


def tfidf_baseline(train_texts, train_y, test_texts, test_y, *, task: str, labels) -> dict:
    """TF-IDF + logistic (ridge) regression; ``*_y`` class ids or floats."""
    # lazy: scikit-learn takes 1.0–1.4 s to import (python -X importtime); only the baselines need it
    from sklearn.feature_extraction.text import TfidfVectorizer

    t0 = time.perf_counter()
    vec = TfidfVectorizer(sublinear_tf=True, stop_words="english", min_df=2 if len(train_texts) >= 20 else 1)
    x_train = vec.fit_transform(train_texts)
    report = _fit_score(x_train, train_y, vec.transform(test_texts), test_y, task, labels)
    return {**report, "seconds": round(time.perf_counter() - t0, 1)}


def frozen_baseline(model_path: str, train_texts, train_y, test_texts, test_y, *, task: str, labels,
                    max_len: int, stride: int, truncate: bool, batch_size: int, progress: bool) -> dict:
    """Logistic (ridge) regression on the starting model's frozen mean-pooled vectors."""
    t0 = time.perf_counter()
    emb = Embedder(model_path, pooling="mean", max_len=max_len, stride=stride, truncate=truncate,
                   batch_size=batch_size, progress=progress)
    x_train, x_test = emb.embed(list(train_texts)), emb.embed(list(test_texts))
    report = _fit_score(x_train, train_y, x_test, test_y, task, labels)
    return {**report, "seconds": round(time.perf_counter() - t0, 1)}


def word_tag_baseline(train_words, train_tags, test_words, test_tags) -> dict:
    """The most frequent training tag of each (lower-cased) word; tags as strings."""
    t0 = time.perf_counter()
    by_word: dict[str, Counter] = {}
    overall: Counter = Counter()
    for words, tags in zip(train_words, train_tags):
        for w, t in zip(words, tags):
            by_word.setdefault(w.lower(), Counter())[t] += 1
            overall[t] += 1
    default = overall.most_common(1)[0][0]
    best = {w: c.most_common(1)[0][0] for w, c in by_word.items()}
    pred = [[best.get(w.lower(), default) for w in words] for words in test_words]
    report = token_report([list(t) for t in test_tags], pred)
    return {**report, "seconds": round(time.perf_counter() - t0, 1)}


def paired(y_true, model_pred, baseline_pred) -> dict:
    """The two classifiers compared example by example on the same test split: how often only the
    model is right (``model_only``), only the baseline (``baseline_only``), and the exact two-sided
    McNemar p-value (binomial test of the discordant pairs against 1/2; 1.0 when there are none)."""
    # lazy: scipy.stats/special take 0.26–0.73 s to import (python -X importtime); only this test needs it
    from scipy.stats import binomtest

    t, a, b = (np.asarray(v) for v in (y_true, model_pred, baseline_pred))
    model_only = int(((a == t) & (b != t)).sum())
    baseline_only = int(((a != t) & (b == t)).sum())
    n = model_only + baseline_only
    p = float(binomtest(model_only, n, 0.5).pvalue) if n else 1.0
    return {"model_only": model_only, "baseline_only": baseline_only, "p_value": p}
