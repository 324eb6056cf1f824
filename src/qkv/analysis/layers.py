"""Per-layer statistics of token representations (layer 0 = the embedding output).

Legend: n vectors, C width, L+1 layers (embeddings first).

* **Anisotropy** — mean cosine similarity between token vectors from *different* contexts
  (Ethayarajh, 2019, §3.3: the baseline a random pair of words already reaches).
* **Self-similarity** of a word type — mean cosine between its vectors in different contexts,
  averaged over word types (Ethayarajh's SelfSim). Low = the representation depends on context.
* **Intra-sentence similarity** — mean cosine between each token of a context and the context's mean
  vector (Ethayarajh's IntraSim), averaged over contexts.
  Both are reported raw and *anisotropy-adjusted* (minus the layer's anisotropy).
* **Linear CKA** (Kornblith et al., 2019) between every pair of layers, on the same tokens.
* **Linear probes** — held-out accuracy of a logistic regression (scikit-learn) on the vectors.

All cosines here are computed exactly from sums of unit vectors: for unit vectors ``u_i``,
``Σ_{i≠j} u_i·u_j = |Σ u_i|² − n``.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = [
    "LayerStats",
    "ProbeResult",
    "ProbeCurve",
    "anisotropy",
    "self_similarity",
    "intra_similarity",
    "linear_cka",
    "cka_matrix",
    "linear_probe",
]


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)  # (…,C)


def _pair_sum(u: np.ndarray) -> float:
    """Σ_{i≠j} u_i·u_j for unit rows ``u`` (n,C)."""
    s = u.sum(0)  # (C,)
    return float(s @ s) - len(u)


def anisotropy(vectors: np.ndarray, contexts: np.ndarray) -> float:
    """Mean cosine over all pairs of vectors that come from different contexts.

    Args:
        vectors: ``(n,C)``.
        contexts: ``(n,)`` context id of each vector.
    """
    u = _unit(vectors)  # (n,C)
    contexts = np.asarray(contexts)
    total, pairs = _pair_sum(u), len(u) * (len(u) - 1)
    for c in np.unique(contexts):
        g = u[contexts == c]
        total -= _pair_sum(g)
        pairs -= len(g) * (len(g) - 1)
    if pairs <= 0:
        raise ValueError("anisotropy needs vectors from at least two contexts")
    return total / pairs


def self_similarity(vectors: np.ndarray, types: np.ndarray) -> tuple[float, dict[int, float]]:
    """Ethayarajh's self-similarity: for each word type, the mean cosine between its occurrences.

    The caller passes one occurrence per (type, context), so pairs are always from different contexts.

    Args:
        vectors: ``(n,C)`` occurrence vectors.
        types: ``(n,)`` word type (token id) of each occurrence.

    Returns:
        the mean over types with ≥ 2 occurrences, and the per-type values.
    """
    u = _unit(vectors)
    types = np.asarray(types)
    per_type = {}
    for t in np.unique(types):
        g = u[types == t]
        if len(g) >= 2:
            per_type[int(t)] = _pair_sum(g) / (len(g) * (len(g) - 1))
    if not per_type:
        raise ValueError("self-similarity needs a word type with at least two occurrences")
    return float(np.mean(list(per_type.values()))), per_type


def intra_similarity(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Ethayarajh's intra-sentence similarity of each context.

    Args:
        hidden: ``(B,T,C)`` one layer's vectors.
        mask: ``(B,T)`` True at the tokens that take part (e.g. real, non-special tokens).

    Returns:
        ``(B,)`` mean over included tokens of cos(token, mean of included tokens); NaN for a context
        with no included token.
    """
    h = np.asarray(hidden, dtype=np.float64)
    m = np.asarray(mask, dtype=np.float64)  # (B,T)
    n = m.sum(1)  # (B,)
    mean = (h * m[..., None]).sum(1) / np.maximum(n, 1)[:, None]  # (B,C)
    cos = (_unit(h) * _unit(mean)[:, None, :]).sum(-1)  # (B,T)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (cos * m).sum(1) / n  # (B,)


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear centred kernel alignment between two representations of the same n examples.

    ``CKA = ‖YᵀX‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F)`` with column-centred X ``(n,C1)`` and Y ``(n,C2)``.
    Invariant to orthogonal transforms and isotropic scaling; 1 for x = y.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"CKA needs the same examples: {x.shape[0]} vs {y.shape[0]} rows")
    x = x - x.mean(0)
    y = y - y.mean(0)
    num = np.linalg.norm(y.T @ x) ** 2  # (C2,n)@(n,C1)
    den = np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)
    return float(num / den) if den > 0 else float("nan")


def cka_matrix(layers: np.ndarray) -> np.ndarray:
    """Linear CKA between every pair of layers: ``layers (L+1,n,C)`` → ``(L+1,L+1)``."""
    k = len(layers)
    out = np.eye(k)
    for i in range(k):
        for j in range(i + 1, k):
            out[i, j] = out[j, i] = linear_cka(layers[i], layers[j])
    return out


@dataclass
class ProbeResult:
    """Held-out accuracy of one linear probe and the majority-class baseline on the same split."""

    accuracy: float
    chance: float
    n_train: int
    n_test: int
    n_classes: int


def _folds(n: int, groups: np.ndarray | None, n_folds: int, seed: int) -> np.ndarray:
    """Fold id of each example; all examples of a group share a fold."""
    groups = np.arange(n) if groups is None else np.asarray(groups)
    uniq = np.unique(groups)
    rank = np.random.default_rng(seed).permutation(len(uniq))
    fold_of = dict(zip(uniq.tolist(), (rank % n_folds).tolist()))
    return np.array([fold_of[g] for g in groups.tolist()])


def linear_probe(
    x: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray | None = None,
    *,
    n_folds: int = 4,
    eval_folds: int = 1,
    seed: int = 0,
    max_iter: int = 300,
) -> ProbeResult:
    """Held-out accuracy of a multinomial logistic regression (standardised features).

    Examples are split into ``n_folds`` folds by ``groups`` (e.g. the document, so that no context is
    seen in training and test); the first ``eval_folds`` folds are each held out in turn and the
    accuracy is pooled over their predictions.
    """
    # lazy: scikit-learn takes 1.0–1.4 s to import (python -X importtime); only the baselines need it
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y)
    fold = _folds(len(y), groups, n_folds, seed)
    correct = base = n_test = n_train = 0
    for f in range(min(eval_folds, n_folds)):
        test, train = fold == f, fold != f
        if not test.any() or not train.any():
            continue
        labels, counts = np.unique(y[train], return_counts=True)
        majority = labels[np.argmax(counts)]
        if len(labels) < 2:
            pred = np.full(test.sum(), majority)
        else:
            clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=max_iter, tol=1e-3))
            with warnings.catch_warnings():  # many classes / few examples, and non-convergence
                warnings.simplefilter("ignore", UserWarning)
                pred = clf.fit(x[train], y[train]).predict(x[test])
        correct += int((pred == y[test]).sum())
        base += int((y[test] == majority).sum())
        n_test += int(test.sum())
        n_train += int(train.sum())
    if n_test == 0:
        raise ValueError(f"a probe needs examples in at least two folds; got {len(y)} examples")
    return ProbeResult(correct / n_test, base / n_test, n_train // max(eval_folds, 1), n_test, len(np.unique(y)))


@dataclass
class ProbeCurve:
    """One probe across layers: ``accuracy (L+1,)`` and the majority-class ``chance``."""

    name: str
    target: str
    accuracy: np.ndarray
    chance: float
    n_train: int
    n_test: int
    n_classes: int


@dataclass
class LayerStats:
    """Per-layer statistics, each ``(L+1,)`` with the embedding output first (see module docstring).

    ``self_similarity_adjusted`` and ``intra_similarity_adjusted`` subtract the layer's anisotropy.
    """

    anisotropy: np.ndarray
    self_similarity: np.ndarray
    intra_similarity: np.ndarray
    mean_norm: np.ndarray
    cka: np.ndarray
    probes: dict[str, ProbeCurve] = field(default_factory=dict)
    n_tokens: int = 0
    n_word_types: int = 0
    n_occurrences: int = 0
    n_contexts: int = 0

    @property
    def self_similarity_adjusted(self) -> np.ndarray:
        return self.self_similarity - self.anisotropy

    @property
    def intra_similarity_adjusted(self) -> np.ndarray:
        return self.intra_similarity - self.anisotropy

    def to_dict(self) -> dict:
        d = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in asdict(self).items()}
        d["probes"] = {
            k: {kk: (vv.tolist() if isinstance(vv, np.ndarray) else vv) for kk, vv in asdict(p).items()}
            for k, p in self.probes.items()
        }
        d["self_similarity_adjusted"] = self.self_similarity_adjusted.tolist()
        d["intra_similarity_adjusted"] = self.intra_similarity_adjusted.tolist()
        return d
