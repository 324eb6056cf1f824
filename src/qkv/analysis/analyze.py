"""Analyse a model over a corpus: sample tokens, stream batches through the model, compute statistics.

Legend: L layers (L+1 hidden states with the embeddings first), H heads, C width, n sampled tokens.

One pass over the corpus. Before it, the tokenised corpus is used to decide (seeded) which token
positions to keep: a uniform sample of content tokens (anisotropy, CKA, token and position probes)
and, for the self-similarity, up to ``max_contexts`` occurrences — one per context — of word types
that occur in at least ``min_contexts`` contexts. During the pass only those vectors, per-context
intra-similarities, per-document sums and the head statistics' running sums are kept, so memory is
bounded by the sample sizes and one batch.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from qkv.analysis.capture import Contexts, in_precision, iter_captures, model_window, tokenize_corpus
from qkv.analysis.collect import LayerCollector, SamplePlan, label_documents, plan_samples
from qkv.analysis.heads import HeadAccumulator, HeadStats
from qkv.analysis.hooked import Batch
from qkv.analysis.inspect_methods import ablation_scan, is_qkv
from qkv.analysis.inputs import AnalysisInputError, Documents, tokenizer_view
from qkv.analysis.layers import (
    LayerStats,
    ProbeCurve,
    anisotropy,
    cka_matrix,
    linear_probe,
    self_similarity,
)
from qkv.validation import check_choice, check_range
from qkv.checkpoints.io import unpack
from qkv.analysis.inputs import model_and_tokenizer, read_corpus
from qkv.analysis.parity import hf_parity
from qkv.analysis.report import write_report
from qkv.nn.maps import PRECISIONS
from tqdm import tqdm

__all__ = ["AnalyzeOptions", "AnalysisResult", "analyze", "run_analyze"]


@dataclass(frozen=True)
class AnalyzeOptions:
    """Options of :func:`analyze`.

    Attributes:
        max_len: window length in tokens including [CLS] and [SEP]; ``None`` = the model's window.
            128 (the default) is the segment length Clark et al. (2019) used.
        fit_window: cut ``max_len`` to the model's window where that is shorter (what the command line's
            default does) instead of refusing it.
        long_text: ``"window"``, ``"truncate"`` or ``"error"`` (see :mod:`qkv.analysis.capture`).
        max_windows_per_doc: keep only the first windows of long documents (``None`` = all).
        batch_size: contexts per forward pass (bounds memory).
        token_sample: content tokens sampled for anisotropy, CKA and the token/position probes.
        min_contexts / max_contexts: self-similarity uses word types seen in at least ``min_contexts``
            contexts, with up to ``max_contexts`` occurrences each (one per context).
        max_word_types: at most this many word types (a seeded random choice) for self-similarity.
        probe_top_tokens: the token-identity probe classifies the most frequent this-many token types.
        probe_max_position: the position probe uses tokens at positions ``1 … probe_max_position-1``.
        max_label_docs: the label probe uses at most this many documents (a seeded sample), which
            bounds the memory of the per-document sums.
        seed: all sampling and probe splits.
        precision: ``"fp32"`` (the model as it is), ``"bf16"`` or ``"int8"``: a qkv model prepared
            by :func:`qkv.inference.for_inference` (int8 calibrated on its fixed text); the
            statistics then describe the model as it runs in that precision (docs/inference.md).
        ablation_contexts: switch each head off alone on the first this-many windows and measure the
            change of the output (:func:`~qkv.analysis.inspect_methods.ablation_scan`); 0 = not at all.
    """

    max_len: int | None = 128
    fit_window: bool = False
    long_text: str = "window"
    max_windows_per_doc: int | None = None
    batch_size: int = 16
    token_sample: int = 4000
    min_contexts: int = 5
    max_contexts: int = 10
    max_word_types: int = 500
    probe_top_tokens: int = 50
    probe_max_position: int = 64
    max_label_docs: int = 2000
    seed: int = 0
    precision: str = "fp32"
    ablation_contexts: int = 8

    def __post_init__(self) -> None:
        check_choice("precision", self.precision, PRECISIONS, error=AnalysisInputError)
        check_range("ablation_contexts", self.ablation_contexts, 0)
        for name in ("batch_size", "token_sample", "max_word_types", "probe_top_tokens", "max_label_docs"):
            check_range(name, getattr(self, name), 1)
        if self.min_contexts < 2 or self.max_contexts < self.min_contexts:
            raise ValueError(
                f"need 2 ≤ min_contexts ≤ max_contexts, got {self.min_contexts} and {self.max_contexts}"
            )


@dataclass
class AnalysisResult:
    """Everything :func:`analyze` measured (plain NumPy / Python values)."""

    model: str
    corpus: str
    n_layers: int
    n_heads: int
    d_model: int
    n_docs: int
    n_contexts: int
    n_tokens: int
    max_len: int
    layers: LayerStats
    heads: HeadStats
    options: AnalyzeOptions
    seconds: dict[str, float]
    ablation: np.ndarray | None = None
    ablation_metric: str = ""
    parity: dict | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("model", "corpus", "n_layers", "n_heads", "d_model", "n_docs")}
        d.update(n_contexts=self.n_contexts, n_tokens=self.n_tokens, max_len=self.max_len)
        d.update(options=asdict(self.options), seconds=self.seconds)
        d.update(layers=self.layers.to_dict(), heads=self.heads.to_dict())
        d.update(ablation=None if self.ablation is None else {"effects": self.ablation.tolist(),
                                                             "metric": self.ablation_metric},
                 parity=self.parity, notes=self.notes)
        return d


def analyze(
    model,
    tokenizer,
    documents: Documents,
    options: AnalyzeOptions | None = None,
    *,
    model_name: str = "",
    progress: bool = False,
) -> AnalysisResult:
    """Layer and head statistics of ``model`` over ``documents`` (one batched pass).

    ``model``: any model whose output has ``hidden_states`` / ``attentions`` (qkv or
    ``transformers``) with its ``tokenizer``, or what :func:`qkv.load` returns (``tokenizer=None``:
    the bundle's; ``analyze(*qkv.load(folder), documents)`` works too).

    Raises:
        AnalysisInputError: empty corpus, texts that do not fit (with ``long_text="error"``), or a
            model whose output lacks hidden states / attentions.
    """
    opts = options or AnalyzeOptions()
    t0 = time.perf_counter()
    model, tokenizer = unpack(model, tokenizer)  # a qkv.load bundle brings its tokenizer
    tokenizer = tokenizer_view(tokenizer)
    window = model_window(model)
    max_len = opts.max_len or window or 512
    if opts.fit_window and window is not None:
        max_len = min(max_len, window)
    if window is not None and max_len > window:
        raise AnalysisInputError(f"max_len {max_len} (--max-len) exceeds the model's window of {window} "
                                 f"positions; choose --max-len {window} or less")
    contexts = tokenize_corpus(
        documents.texts, tokenizer, max_len=max_len, long_text=opts.long_text,
        max_windows_per_doc=opts.max_windows_per_doc,
    )
    if len(contexts) < 2:
        raise AnalysisInputError(
            "the corpus gives a single context; the statistics compare contexts (anisotropy, "
            "self-similarity, probes): give at least two documents or a longer text"
        )
    model = in_precision(model, tokenizer, opts.precision, max_len)
    plan = plan_samples(contexts, opts.token_sample, opts.min_contexts, opts.max_contexts,
                        opts.max_word_types, opts.seed)
    label_rows = label_documents(documents, contexts.n_docs, opts.max_label_docs, opts.seed)
    t_tok = time.perf_counter()

    cls_id, sep_id = (-1 if i is None else i for i in (tokenizer.cls_id, tokenizer.sep_id))  # -1: none
    collector = LayerCollector(plan, contexts, label_rows, cls_id, sep_id)
    heads = HeadAccumulator(cls_id, sep_id)
    batches = iter_captures(model, contexts, batch_size=opts.batch_size, pad_id=tokenizer.pad_id)
    if progress:
        batches = tqdm(batches, total=-(-len(contexts) // opts.batch_size), desc="analyze", unit="batch")
    for cap in batches:
        collector.update(cap)
        heads.update(cap.attentions, cap.mask, cap.input_ids)
    t_pass = time.perf_counter()

    # Small dense problems: one BLAS/OpenMP thread is faster than several (10× on a busy 2-core box).
    with threadpool_limits(limits=1):
        layer_stats = _layer_stats(collector, plan, contexts, opts)
        if collector.doc_sum is not None:
            labels = [documents.labels[d] for d in np.flatnonzero(label_rows >= 0)]
            curve = _label_probe(collector.doc_sum, collector.doc_count, labels, opts.seed)
            if curve is not None:
                layer_stats.probes["label"] = curve
    ablation, metric, notes = None, "", []
    if opts.ablation_contexts:
        if is_qkv(model):
            ablation, metric = ablation_scan(model, _first_windows(contexts, opts.ablation_contexts, tokenizer.pad_id))
            metric += f" (first {min(opts.ablation_contexts, len(contexts))} windows)"
        else:
            notes.append("head ablation: needs a qkv model (load the folder with qkv.load)")
    t_end = time.perf_counter()
    head_stats = heads.result()
    n_hidden, _, width = collector.tok_vecs.shape
    return AnalysisResult(
        model=model_name,
        corpus=documents.source,
        n_layers=n_hidden - 1,
        n_heads=head_stats.n_heads,
        d_model=width,
        n_docs=len(documents),
        n_contexts=len(contexts),
        n_tokens=int(contexts.lengths.sum()),
        max_len=max_len,
        layers=layer_stats,
        heads=head_stats,
        options=opts,
        seconds={"tokenize": t_tok - t0, "forward_and_heads": t_pass - t_tok, "layers_probes_ablation": t_end - t_pass,
                 "total": t_end - t0},
        ablation=ablation, ablation_metric=metric, notes=notes,
    )


def _first_windows(contexts: Contexts, n: int, pad_id: int) -> Batch:
    """The first ``n`` windows as one right-padded batch."""
    rows = contexts.ids[:n]
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.from_numpy(np.asarray(r, dtype=np.int64)), True
    return Batch(ids, mask)


def _layer_stats(col: LayerCollector, plan: SamplePlan, contexts: Contexts, opts: AnalyzeOptions) -> LayerStats:
    tok_vecs, occ_vecs = col.tok_vecs, col.occ_vecs
    n_hidden = tok_vecs.shape[0]
    aniso = np.array([anisotropy(tok_vecs[i], plan.token_ctx) for i in range(n_hidden)])
    if len(plan.occ_type):  # every planned type has ≥ min_contexts ≥ 2 occurrences
        selfsim = np.array([self_similarity(occ_vecs[i], plan.occ_type)[0] for i in range(n_hidden)])
    else:
        selfsim = np.full(n_hidden, np.nan)
    groups = contexts.doc[plan.token_ctx]  # split probes by document: no context in train and test
    probes: dict[str, ProbeCurve] = {}
    ids = np.array([contexts.ids[c][p] for c, p in zip(plan.token_ctx, plan.token_pos)], dtype=np.int64)
    top = [t for t, _ in Counter(ids.tolist()).most_common(opts.probe_top_tokens)]
    keep = np.isin(ids, top)
    if len(top) >= 2 and len(np.unique(groups[keep])) >= 4:
        probes["token"] = _probe_curve("token", f"identity of the token (top {len(top)} types)",
                                       tok_vecs[:, keep], ids[keep], groups[keep], opts.seed)
    keep = plan.token_pos < opts.probe_max_position
    if len(np.unique(plan.token_pos[keep])) >= 2 and len(np.unique(groups[keep])) >= 4:
        probes["position"] = _probe_curve("position", f"position in the window (1–{opts.probe_max_position - 1})",
                                          tok_vecs[:, keep], plan.token_pos[keep], groups[keep], opts.seed)
    return LayerStats(
        anisotropy=aniso,
        self_similarity=selfsim,
        intra_similarity=col.intra_sum / max(col.n_contexts, 1),
        mean_norm=col.norm_sum / max(col.n_content, 1),
        cka=cka_matrix(tok_vecs),
        probes=probes,
        n_tokens=len(plan.token_ctx),
        n_word_types=len(np.unique(plan.occ_type)),
        n_occurrences=len(plan.occ_type),
        n_contexts=col.n_contexts,
    )


def _probe_curve(name, target, vecs, y, groups, seed, n_folds=4, eval_folds=1) -> ProbeCurve:
    results = [linear_probe(v, y, groups, n_folds=n_folds, eval_folds=eval_folds, seed=seed) for v in vecs]
    r = results[0]
    return ProbeCurve(name, target, np.array([x.accuracy for x in results]), r.chance, r.n_train, r.n_test,
                      r.n_classes)


def _label_probe(doc_sum, doc_count, labels, seed) -> ProbeCurve | None:
    ok = doc_count > 0
    y = np.array(labels)[ok]
    if ok.sum() < 10 or len(np.unique(y)) < 2:
        return None
    vecs = doc_sum[:, ok] / doc_count[ok][None, :, None]  # (L+1,docs,C) mean-pooled
    return _probe_curve("label", "document label (mean-pooled, 5-fold)", vecs, y, None, seed, 5, 5)


def run_analyze(
    model_path,
    corpus: str | list[str],
    out_dir: str | Path,
    options: AnalyzeOptions | None = None,
    *,
    max_docs: int | None = None,
    progress: bool = False,
    parity: bool = True,
) -> tuple[AnalysisResult, dict[str, Path]]:
    """Load a model folder (or take what :func:`qkv.load` returned) and a corpus, analyse, and
    write the report into ``out_dir``.

    Returns the result and the paths written (``report.html``, ``report.md``, ``analysis.json``,
    figures). For a Hugging Face folder (and ``parity``), the report says how far qkv's numbers are from
    ``transformers``' own on the first windows (:mod:`qkv.analysis.parity`).
    """
    opts = options or AnalyzeOptions()
    documents = read_corpus(corpus, max_docs=max_docs, seed=opts.seed)  # cheap errors first
    model, tokenizer, name = model_and_tokenizer(model_path)
    result = analyze(model, tokenizer, documents, opts, model_name=name, progress=progress)
    if parity:
        window = result.max_len
        contexts = tokenize_corpus(documents.texts[:4], tokenizer_view(tokenizer), max_len=window, long_text="truncate")
        report, why = hf_parity(model_path, model, _first_windows(contexts, 4, tokenizer_view(tokenizer).pad_id))
        result.parity = None if report is None else report.to_dict()
        if report is None and why != "not a Hugging Face folder":
            result.notes.append(f"parity: no report ({why})")
    return result, write_report(result, out_dir)
