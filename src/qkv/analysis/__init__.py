"""Understanding a model: every layer's outputs, every head's attention, and how layers differ.

Python API (all results are dataclasses holding NumPy arrays):

* :func:`analyze` / :func:`run_analyze` — layer statistics (:class:`LayerStats`) and head statistics
  (:class:`HeadStats`) over a corpus, and the report folder (``qkv analyze``);
* :func:`inspect_text` / :func:`run_inspect` — one text's attention maps, PNG heatmaps and the
  offline HTML viewer (``qkv inspect``);
* the building blocks: :func:`iter_captures` (batched capture), :func:`anisotropy`,
  :func:`self_similarity`, :func:`intra_similarity`, :func:`linear_cka`, :func:`linear_probe`,
  :func:`head_statistics`.

See docs/analysis.md.
"""

from qkv.analysis.analyze import AnalysisResult, AnalyzeOptions, analyze, run_analyze
from qkv.analysis.capture import Capture, Contexts, iter_captures, tokenize_corpus
from qkv.analysis.heads import HEAD_METRICS, HeadAccumulator, HeadStats, head_statistics
from qkv.analysis.inputs import (
    AnalysisInputError,
    Documents,
    load_model,
    read_corpus,
    tokenizer_view,
)
from qkv.analysis.layers import (
    LayerStats,
    ProbeCurve,
    ProbeResult,
    anisotropy,
    cka_matrix,
    intra_similarity,
    linear_cka,
    linear_probe,
    self_similarity,
)
from qkv.analysis.report import write_report
from qkv.analysis.viewer import Inspection, inspect_text, run_inspect, write_inspection

__all__ = [
    "AnalysisInputError",
    "AnalysisResult",
    "AnalyzeOptions",
    "Capture",
    "Contexts",
    "Documents",
    "HEAD_METRICS",
    "HeadAccumulator",
    "HeadStats",
    "Inspection",
    "LayerStats",
    "ProbeCurve",
    "ProbeResult",
    "analyze",
    "anisotropy",
    "cka_matrix",
    "head_statistics",
    "inspect_text",
    "intra_similarity",
    "iter_captures",
    "linear_cka",
    "linear_probe",
    "load_model",
    "read_corpus",
    "run_analyze",
    "run_inspect",
    "self_similarity",
    "tokenize_corpus",
    "tokenizer_view",
    "write_inspection",
    "write_report",
]
