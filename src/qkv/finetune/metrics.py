"""Evaluation metrics for ``qkv finetune``: sequence classification, regression, token classification.

Everything returns plain Python floats, ints, lists and dicts (JSON-serialisable). Definitions:

Classification (:func:`classification_report`), over the classes ``0..L-1`` named by ``labels``:
    accuracy = correct / n. Per class c: precision = TP/(TP+FP), recall = TP/(TP+FN),
    F1 = 2TP/(2TP+FP+FN); any 0/0 is 0. ``macro_f1`` is the plain mean of the per-class F1 over
    *all* L classes (a class that is neither present nor predicted counts as F1 = 0);
    ``weighted_f1`` weights each class's F1 by its support (count in ``y_true``). This is exactly
    sklearn's ``f1_score(average="macro"|"weighted", labels=range(L), zero_division=0)``.
    ``confusion[i][j]`` counts examples of true class i predicted as j.

Regression (:func:`regression_report`):
    rmse = sqrt(mean((pred - true)^2)), mae = mean(|pred - true|), pearson = Pearson's r,
    spearman = Pearson's r of the ranks (ties get their average rank, as ``scipy.stats.spearmanr``).
    A correlation is ``None`` where either side is constant (it is undefined there).

Entities (:func:`spans`, :func:`token_report`), decoded the way CoNLL's ``conlleval`` (and seqeval's
default mode) does, leniently: a chunk starts at ``B-``/``S-``, at an ``I-``/``E-`` that follows
``O``, ``E-``, ``S-`` or a tag of another type; it ends before ``B-``/``S-``/``O``, after ``E-``/``S-``,
and wherever the type changes. So ``O I-PER I-PER`` is one PER entity, ``B-PER I-LOC`` is two.
With this decoding IOB1 and IOB2 read alike; the ``scheme`` only decides which prefixes are legal
(IOB1/IOB2: ``B-``, ``I-``; BIOES: also ``E-``, ``S-``) and a prefix outside it raises ValueError.
``"auto"`` is BIOES where any tag has an ``E-``/``S-`` prefix, else IOB2. A tag without a prefix
(``"PER"``) is read as ``I-PER``: the IO scheme, where each maximal run of one tag is one entity.
Entity precision/recall/F1 are micro-averaged over all spans of all sentences; a predicted span
counts only on an exact (type, start, end) match; 0/0 is 0.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from qkv._fs import atomic_write_bytes

__all__ = ["classification_report", "regression_report", "spans", "token_report", "plot_confusion",
           "format_classification", "format_token", "format_regression"]

SCHEMES = ("IOB1", "IOB2", "BIOES", "IOBES", "auto")


def _div(a: float, b: float) -> float:
    return float(a) / float(b) if b else 0.0


def _ids(y, name: str, n_labels: int) -> np.ndarray:
    a = np.asarray(y)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of class ids, got shape {a.shape}")
    if a.size and a.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integer class ids, got dtype {a.dtype}")
    bad = np.flatnonzero((a < 0) | (a >= n_labels))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name}[{i}] = {a[i]} is out of range for {n_labels} labels (0..{n_labels - 1})"
                         f"; {bad.size} id(s) out of range")
    return a.astype(np.int64)


def classification_report(y_true: Sequence[int], y_pred: Sequence[int], labels: Sequence[str]) -> dict:
    """Accuracy, macro/weighted F1, per-class P/R/F1/support and the confusion matrix.

    Returns ``{"accuracy", "macro_f1", "weighted_f1", "per_class": [{"label", "precision", "recall",
    "f1", "support"}, ...], "confusion": L×L list (rows true, columns predicted), "n"}``.

    Raises:
        ValueError: no labels, no examples, unequal lengths, non-integer or out-of-range ids.
    """
    labels = [str(x) for x in labels]
    n_labels = len(labels)
    if n_labels == 0:
        raise ValueError("labels is empty: need at least one class name")
    if len(y_true) != len(y_pred):
        raise ValueError(f"y_true has {len(y_true)} items but y_pred has {len(y_pred)}")
    if len(y_true) == 0:
        raise ValueError("y_true and y_pred are empty: nothing to evaluate")
    t, p = _ids(y_true, "y_true", n_labels), _ids(y_pred, "y_pred", n_labels)
    conf = np.bincount(t * n_labels + p, minlength=n_labels * n_labels).reshape(n_labels, n_labels)
    tp = np.diag(conf)
    support, predicted = conf.sum(axis=1), conf.sum(axis=0)
    per_class, f1s = [], []
    for c, name in enumerate(labels):
        f1 = _div(2 * tp[c], support[c] + predicted[c])  # 2TP / (2TP + FP + FN)
        f1s.append(f1)
        per_class.append({"label": name, "precision": _div(tp[c], predicted[c]),
                          "recall": _div(tp[c], support[c]), "f1": f1, "support": int(support[c])})
    return {"accuracy": float(tp.sum() / len(t)), "macro_f1": float(np.mean(f1s)),
            "weighted_f1": float(np.average(f1s, weights=support)), "per_class": per_class,
            "confusion": conf.tolist(), "n": len(t)}


def _values(y, name: str) -> np.ndarray:
    try:
        a = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must hold numbers: {e}") from None
    if a.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of numbers, got shape {a.shape}")
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        raise ValueError(f"{name}[{int(bad[0])}] = {a[bad[0]]} is not finite")
    return a


def _rank(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    new = np.r_[True, xs[1:] != xs[:-1]]
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:], len(x)]
    ranks = np.empty(len(x))
    ranks[order] = ((starts + ends + 1) / 2.0)[np.cumsum(new) - 1]
    return ranks


def _pearson(a: np.ndarray, b: np.ndarray) -> float | None:
    if len(a) < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return None
    da, db = a - a.mean(), b - b.mean()
    r = float(np.dot(da, db) / math.sqrt(np.dot(da, da) * np.dot(db, db)))
    return max(-1.0, min(1.0, r))


def regression_report(y_true: Sequence[float], y_pred: Sequence[float]) -> dict:
    """``{"rmse", "mae", "pearson", "spearman", "n"}``; a correlation is None where a side is constant.

    Raises:
        ValueError: unequal lengths, no examples, non-numeric or non-finite values.
    """
    t, p = _values(y_true, "y_true"), _values(y_pred, "y_pred")
    if len(t) != len(p):
        raise ValueError(f"y_true has {len(t)} items but y_pred has {len(p)}")
    if len(t) == 0:
        raise ValueError("y_true and y_pred are empty: nothing to evaluate")
    err = p - t
    return {"rmse": float(np.sqrt(np.mean(err * err))), "mae": float(np.mean(np.abs(err))),
            "pearson": _pearson(t, p), "spearman": _pearson(_rank(t), _rank(p)), "n": len(t)}


def _parse(tag: str, legal: str, where: str) -> tuple[str, str]:
    """``(prefix, type)`` with prefix one of B I E S O; an unprefixed tag is ``("I", tag)``."""
    if not isinstance(tag, str) or not tag:
        raise ValueError(f"{where}: tag {tag!r} is not a non-empty string")
    if tag == "O":
        return "O", ""
    if len(tag) >= 2 and tag[1] == "-" and tag[0] in "BIES":
        if len(tag) == 2:
            raise ValueError(f"{where}: tag {tag!r} has a prefix but no entity type")
        if tag[0] not in legal:
            raise ValueError(f"{where}: tag {tag!r} is not allowed in this scheme, which takes "
                             + ", ".join(f"{c}-TYPE" for c in legal) + ", O or an unprefixed TYPE")
        return tag[0], tag[2:]
    return "I", tag


def _resolve(scheme: str, tags) -> str:
    s = scheme if scheme == "auto" else str(scheme).upper()
    if s not in SCHEMES:
        raise ValueError(f"scheme={scheme!r}: expected one of {', '.join(SCHEMES)}")
    if s == "auto":
        bioes = any(isinstance(t, str) and len(t) > 2 and t[1] == "-" and t[0] in "ES" for t in tags)
        return "BIOES" if bioes else "IOB2"
    return "BIOES" if s == "IOBES" else s


def _spans(tags: Sequence[str], scheme: str, where: str) -> set[tuple[str, int, int]]:
    legal = "BIES" if scheme == "BIOES" else "BI"
    parsed = [_parse(t, legal, f"{where}token {i}") for i, t in enumerate(tags)]
    out: set[tuple[str, int, int]] = set()
    start, pp, pt = None, "O", ""
    for i, (p, t) in enumerate([*parsed, ("O", "")]):
        if start is not None and (pp in "ES" or (pp in "BI" and p in "BSO") or pt != t):
            out.add((pt, start, i))
            start = None
        if p in "BS" or (p in "IE" and pp in "ESO") or (p != "O" and pt != t):
            start = i
        pp, pt = p, t
    return out


def spans(tags: Sequence[str], scheme: str = "IOB2") -> set[tuple[str, int, int]]:
    """The entities of one tagged sentence as ``{(type, start, end_exclusive)}`` (module docstring).

    Raises:
        ValueError: an unknown scheme, an empty tag, ``B-`` without a type, or a prefix the scheme
            does not allow (e.g. ``S-PER`` under IOB2).
    """
    return _spans(tags, _resolve(scheme, tags), "")


def _prf(tp: int, n_pred: int, n_true: int) -> tuple[float, float, float]:
    return _div(tp, n_pred), _div(tp, n_true), _div(2 * tp, n_pred + n_true)


def token_report(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]],
                 scheme: str = "auto") -> dict:
    """Token accuracy and entity-level micro P/R/F1 with a per-type breakdown.

    Returns ``{"token_accuracy", "entity_precision", "entity_recall", "entity_f1", "per_type":
    [{"type", "precision", "recall", "f1", "support"}, ...] (sorted by type), "n_tokens",
    "n_sentences", "n_true_entities", "n_pred_entities", "scheme"}``; ``"auto"`` is resolved over
    the tags of both sides together.

    Raises:
        ValueError: unequal sentence counts or lengths (naming the sentence), no tokens at all,
            or a tag :func:`spans` rejects.
    """
    if len(true_tags) != len(pred_tags):
        raise ValueError(f"true_tags has {len(true_tags)} sentences but pred_tags has {len(pred_tags)}")
    for i, (a, b) in enumerate(zip(true_tags, pred_tags)):
        if len(a) != len(b):
            raise ValueError(f"sentence {i}: {len(a)} true tags but {len(b)} predicted tags")
    scheme = _resolve(scheme, [t for sent in (*true_tags, *pred_tags) for t in sent])
    n_tokens = correct = 0
    tp, n_true, n_pred = {}, {}, {}
    for i, (a, b) in enumerate(zip(true_tags, pred_tags)):
        n_tokens += len(a)
        correct += sum(x == y for x, y in zip(a, b))
        gold = _spans(a, scheme, f"true_tags sentence {i}, ")
        pred = _spans(b, scheme, f"pred_tags sentence {i}, ")
        for kind, group in ((n_true, gold), (n_pred, pred), (tp, gold & pred)):
            for typ, _, _ in group:
                kind[typ] = kind.get(typ, 0) + 1
    if n_tokens == 0:
        raise ValueError("no tokens to evaluate")
    per_type = []
    for typ in sorted(set(n_true) | set(n_pred)):
        p, r, f = _prf(tp.get(typ, 0), n_pred.get(typ, 0), n_true.get(typ, 0))
        per_type.append({"type": typ, "precision": p, "recall": r, "f1": f, "support": n_true.get(typ, 0)})
    tot_true, tot_pred = sum(n_true.values()), sum(n_pred.values())
    p, r, f = _prf(sum(tp.values()), tot_pred, tot_true)
    return {"token_accuracy": correct / n_tokens, "entity_precision": p, "entity_recall": r,
            "entity_f1": f, "per_type": per_type, "n_tokens": n_tokens, "n_sentences": len(true_tags),
            "n_true_entities": tot_true, "n_pred_entities": tot_pred, "scheme": scheme}


def plot_confusion(confusion: Sequence[Sequence[int]], labels: Sequence[str], path: str | os.PathLike,
                   *, title: str = "") -> Path:
    """A confusion-matrix PNG at ``path``: colours are row-normalised (share of each true class),
    counts are written in the cells up to 25 classes, and the figure grows with the class count.
    Written atomically (temp file beside ``path``, then a rename); the parent folder is created."""
    # lazy: matplotlib takes 0.4–0.6 s to import (python -X importtime); only plotting needs it
    from matplotlib.figure import Figure

    conf = np.asarray(confusion, dtype=np.int64)
    labels = [str(x) for x in labels]
    n = len(labels)
    if conf.ndim != 2 or conf.shape != (n, n):
        raise ValueError(f"confusion has shape {conf.shape} but there are {n} labels: expected ({n}, {n})")
    if n == 0:
        raise ValueError("labels is empty: nothing to plot")
    rows = conf.sum(axis=1, keepdims=True)
    norm = np.divide(conf, rows, out=np.zeros(conf.shape), where=rows > 0)
    shown = [x if len(x) <= 24 else x[:23] + "…" for x in labels]
    margin = 1.0 + 0.075 * max(len(x) for x in shown)  # room for the tick labels, inches
    side = min(max(0.45 * n if n <= 25 else 0.3 * n, 3.0), 22.0)
    fig = Figure(figsize=(side + margin + 1.4, side + margin + 0.6), dpi=100)
    ax = fig.subplots()
    im = ax.imshow(norm, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    tick_font = max(7.0, min(10.0, 260.0 / n))
    ax.set_xticks(range(n), shown, rotation=90 if n > 8 else 45, ha="center" if n > 8 else "right",
                  fontsize=tick_font)
    ax.set_yticks(range(n), shown, fontsize=tick_font)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title or f"confusion ({int(conf.sum())} examples)")
    if n <= 25:
        cell_font = max(6.0, min(10.0, 180.0 / n))
        for i in range(n):
            for j in range(n):
                if conf[i, j]:
                    ax.text(j, i, str(conf[i, j]), ha="center", va="center", fontsize=cell_font,
                            color="white" if norm[i, j] > 0.5 else "black")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _num(x, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned first column, right-aligned others."""
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) if k == 0 else c.rjust(w)  # noqa: E731
                              for k, (c, w) in enumerate(zip(r, widths)))
    lines = [fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows)]
    return "\n".join(line.rstrip() for line in lines)


def _headline(report: dict, baselines: dict[str, dict] | None, keys: list[tuple[str, str]]) -> str:
    rows = [["model", *(_num(report.get(k)) for k, _ in keys), str(report.get("n", "-"))]]
    for name, b in (baselines or {}).items():
        rows.append([name, *(_num(b.get(k)) for k, _ in keys), str(b.get("n", "-"))])
    return _table(["", *(title for _, title in keys), "n"], rows)


def format_classification(report: dict, *, baselines: dict[str, dict] | None = None) -> str:
    """Headline accuracy / macro-F1 / weighted-F1 (baselines, name → report, as extra rows), then
    per-class precision, recall, F1 and support."""
    head = _headline(report, baselines, [("accuracy", "accuracy"), ("macro_f1", "macro-F1"),
                                         ("weighted_f1", "weighted-F1")])
    rows = [[c["label"], _num(c["precision"]), _num(c["recall"]), _num(c["f1"]), str(c["support"])]
            for c in report["per_class"]]
    return head + "\n\n" + _table(["class", "precision", "recall", "F1", "support"], rows)


def format_regression(report: dict, *, baselines: dict[str, dict] | None = None) -> str:
    """RMSE / MAE / Pearson / Spearman for the model and any baselines (name → report); ``-`` is
    an undefined correlation."""
    return _headline(report, baselines, [("rmse", "RMSE"), ("mae", "MAE"), ("pearson", "Pearson"),
                                         ("spearman", "Spearman")])


def format_token(report: dict) -> str:
    """Token accuracy and entity P/R/F1, then the per-type breakdown."""
    head = (f"token accuracy {_num(report['token_accuracy'])} over {report['n_tokens']} tokens, "
            f"{report['n_sentences']} sentences ({report.get('scheme', '?')})\n"
            f"entities: precision {_num(report['entity_precision'])}  recall "
            f"{_num(report['entity_recall'])}  F1 {_num(report['entity_f1'])}")
    if "n_true_entities" in report:
        head += f"  ({report['n_true_entities']} true, {report['n_pred_entities']} predicted)"
    rows = [[t["type"], _num(t["precision"]), _num(t["recall"]), _num(t["f1"]), str(t["support"])]
            for t in report["per_type"]]
    return head + "\n\n" + _table(["type", "precision", "recall", "F1", "support"], rows)
