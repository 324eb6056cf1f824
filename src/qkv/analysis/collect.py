"""What the corpus pass keeps: a seeded plan of token positions, and a collector fed batch by batch.

Legend: L+1 hidden states (embeddings first), B contexts in a batch, T length, C width,
n sampled tokens, m self-similarity occurrences, D documents used by the label probe.

The plan is drawn from the tokenised corpus *before* the forward pass, so the pass keeps only the
vectors it needs: memory is ``O((n + m + D)·(L+1)·C)`` plus one batch, whatever the corpus size.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from qkv.analysis.capture import Capture, Contexts
from qkv.analysis.inputs import Documents
from qkv.analysis.layers import intra_similarity

__all__ = ["SamplePlan", "plan_samples", "label_documents", "LayerCollector"]


@dataclass
class SamplePlan:
    """Token positions to keep. ``token_*``: a uniform sample of content tokens (no [CLS]/[SEP]);
    ``occ_*``: occurrences of frequent whole-word types, one per context, for self-similarity."""

    token_ctx: np.ndarray  # (n,) context of each sampled token
    token_pos: np.ndarray  # (n,) its position in the context
    occ_ctx: np.ndarray  # (m,)
    occ_pos: np.ndarray  # (m,)
    occ_type: np.ndarray  # (m,) token id of each occurrence


def plan_samples(contexts: Contexts, token_sample: int, min_contexts: int, max_contexts: int,
                 max_word_types: int, seed: int) -> SamplePlan:
    """Draw the token sample and the self-similarity occurrences (seeded, deterministic)."""
    rng = np.random.default_rng(seed)
    content = contexts.lengths - contexts.n_prefix - contexts.n_suffix  # tokens between [CLS] and [SEP]
    total = int(content.sum())
    pick = np.sort(rng.choice(total, size=min(token_sample, total), replace=False))
    ctx_of = np.repeat(np.arange(len(contexts)), content)  # (total,)
    first = np.concatenate([[0], np.cumsum(content)[:-1]])  # offset of each context's first token
    token_ctx = ctx_of[pick]
    token_pos = pick - first[token_ctx] + contexts.n_prefix  # after [CLS]

    seen: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for c, (ids, whole) in enumerate(zip(contexts.ids, contexts.whole_word)):
        for p in np.flatnonzero(whole):
            seen[int(ids[p])][c].append(int(p))
    eligible = sorted(t for t, by_ctx in seen.items() if len(by_ctx) >= min_contexts)
    if len(eligible) > max_word_types:
        eligible = sorted(rng.choice(eligible, size=max_word_types, replace=False).tolist())
    occ = []
    for t in eligible:
        ctxs = sorted(seen[t])
        chosen = rng.choice(ctxs, size=min(max_contexts, len(ctxs)), replace=False)
        for c in sorted(chosen.tolist()):
            occ.append((c, int(rng.choice(seen[t][c])), t))
    occ_arr = np.array(occ, dtype=np.int64).reshape(-1, 3)
    return SamplePlan(token_ctx, token_pos, occ_arr[:, 0], occ_arr[:, 1], occ_arr[:, 2])


def label_documents(documents: Documents, n_docs: int, max_docs: int, seed: int) -> np.ndarray:
    """Row of each document in the per-document sums, or -1 when the label probe does not use it
    (no labels; or beyond a seeded sample of ``max_docs`` documents)."""
    rows = np.full(n_docs, -1, dtype=np.int64)
    if documents.labels is None:
        return rows
    chosen = np.arange(n_docs)
    if n_docs > max_docs:
        chosen = np.sort(np.random.default_rng(seed + 1).choice(n_docs, size=max_docs, replace=False))
    rows[chosen] = np.arange(len(chosen))
    return rows


def _gather(index_ctx: np.ndarray, index_pos: np.ndarray, batch_ctx: np.ndarray):
    """For one batch: (rows in the batch, positions, indices into the sample) of planned tokens."""
    row_of = {int(c): r for r, c in enumerate(batch_ctx)}
    sel = np.flatnonzero(np.isin(index_ctx, batch_ctx))
    rows = np.array([row_of[int(c)] for c in index_ctx[sel]], dtype=np.int64)
    return rows, index_pos[sel], sel


class LayerCollector:
    """Fed one :class:`Capture` at a time; keeps the planned vectors and running sums.

    Attributes (after the pass):
        tok_vecs: ``(L+1,n,C)``; occ_vecs: ``(L+1,m,C)``.
        intra_sum: ``(L+1,)`` sum over contexts of the intra-context similarity; n_contexts.
        norm_sum: ``(L+1,)`` sum of content-token norms; n_content.
        doc_sum: ``(L+1,D,C)`` per-document sums of content vectors (``None`` without labels);
        doc_count: ``(D,)`` content tokens per document.
    """

    def __init__(self, plan: SamplePlan, contexts: Contexts, label_rows: np.ndarray, cls_id: int, sep_id: int):
        self.plan, self.contexts, self.label_rows = plan, contexts, label_rows
        self.cls_id, self.sep_id = cls_id, sep_id
        self.tok_vecs = self.occ_vecs = self.doc_sum = None
        self.intra_sum = self.norm_sum = None
        self.doc_count = np.zeros(int(label_rows.max(initial=-1)) + 1)
        self.n_content = self.n_contexts = 0

    def _allocate(self, n_hidden: int, width: int) -> None:
        self.tok_vecs = np.zeros((n_hidden, len(self.plan.token_ctx), width), dtype=np.float32)
        self.occ_vecs = np.zeros((n_hidden, len(self.plan.occ_ctx), width), dtype=np.float32)
        if len(self.doc_count):
            self.doc_sum = np.zeros((n_hidden, len(self.doc_count), width), dtype=np.float64)
        self.intra_sum, self.norm_sum = np.zeros(n_hidden), np.zeros(n_hidden)

    def update(self, cap: Capture) -> None:
        hs = cap.hidden_states  # (L+1,B,T,C)
        if self.tok_vecs is None:
            self._allocate(hs.shape[0], hs.shape[3])
        p = self.plan
        for index_ctx, index_pos, dest in ((p.token_ctx, p.token_pos, self.tok_vecs),
                                           (p.occ_ctx, p.occ_pos, self.occ_vecs)):
            rows, pos, sel = _gather(index_ctx, index_pos, cap.context)
            dest[:, sel] = hs[:, rows, pos]  # (L+1,k,C)
        content = cap.mask & (cap.input_ids != self.cls_id) & (cap.input_ids != self.sep_id)  # (B,T)
        for layer in range(hs.shape[0]):
            self.intra_sum[layer] += np.nansum(intra_similarity(hs[layer], content))
            self.norm_sum[layer] += float((np.linalg.norm(hs[layer], axis=-1) * content).sum())
        self.n_content += int(content.sum())
        self.n_contexts += int(content.any(1).sum())
        if self.doc_sum is not None:
            rows = self.label_rows[self.contexts.doc[cap.context]]  # (B,) row of each context's document
            keep = rows >= 0
            pooled = (hs[:, keep] * content[None, keep, :, None]).sum(2)  # (L+1,b,T,C) -> (L+1,b,C)
            np.add.at(self.doc_sum, (slice(None), rows[keep]), pooled)  # sum per document
            np.add.at(self.doc_count, rows[keep], content[keep].sum(1))
