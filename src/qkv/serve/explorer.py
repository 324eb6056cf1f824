"""What the attention explorer asks the server for: one text's attention (``/v1/attention``) and the
nearest documents of the index given at start (``/v1/search``).

Attention comes from :func:`qkv.analysis.inspect_text` (every layer's and head's exact weights,
the model run as loaded); the weights travel as the offline viewer's do: per layer, base64 of
little-endian uint16 ``round(w · 65535)`` laid out ``(H,T,T)`` (error ≤ 7.7e-6,
:func:`~qkv.analysis.viewer_html.quantize_attention`). Search is a
:class:`~qkv.embeddings.search.SearchIndex` opened once.
"""

from __future__ import annotations

import base64

from qkv.analysis.inputs import AnalysisInputError
from qkv.analysis.viewer import inspect_text
from qkv.analysis.viewer_html import quantize_attention
from qkv.embeddings.search import SearchIndex
from qkv.serve.errors import ApiError

__all__ = ["AttentionOperation", "SearchOperation", "METHODS"]

#: The explorer's views of a text's attention (more arrive with the interpretability methods).
METHODS = ("attention",)


class AttentionOperation:
    """Every layer's and head's attention for one text (or a pair) at a time.

    Args:
        model: any qkv model (its encoder stack, or a causal LM's decoder stack, is read).
        tokenizer: its tokenizer (with ``[CLS]``, ``[SEP]``, ``[PAD]``).
    """

    name = "attention"

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    def run(self, payloads: list[tuple[str, str | None, bool]]) -> list[dict]:
        return [self._one(*p) for p in payloads]

    def _one(self, text: str, pair: str | None, truncate: bool) -> dict:
        try:
            ins = inspect_text(self.model, self.tokenizer, text, pair, long_text="truncate" if truncate else "error")
        except AnalysisInputError as e:
            message = str(e).replace("long_text='truncate' (--truncate)", '"truncate": true')
            raise ApiError(400, message, param="input", code="invalid_value") from None
        q = quantize_attention(ins.attentions)  # (L,H,T,T) uint16
        return {"tokens": ins.tokens, "special": [bool(s) for s in ins.special],
                "n_layers": int(q.shape[0]), "n_heads": int(q.shape[1]), "encoding": "uint16-base64",
                "attention": [base64.b64encode(layer.tobytes()).decode("ascii") for layer in q]}  # (H,T,T) each


class SearchOperation:
    """Queries against the index given at start (its own model and embedding options).

    Args:
        index: the index folder (``qkv index``).
        precision: how queries are embedded.
    """

    name = "search"

    def __init__(self, index, *, precision: str):
        self.index = SearchIndex(index, device="cpu", precision=precision)
        self.count, self.dim = len(self.index), int(self.index.meta["dim"])

    def count_tokens(self, queries: list[str]) -> list[int]:
        return [len(ids) + 2 for ids in self.index.embedder.tokenizer.encode(queries)]

    def run(self, payloads: list[tuple[list[str], int]]) -> list[list[list[dict]]]:
        """Each request's ``(queries, k)`` → per query its hits (the batch ranks with the largest k)."""
        k = max(top_k for _, top_k in payloads)
        hits = self.index.query([q for queries, _ in payloads for q in queries], k=min(k, self.count))
        out, start = [], 0
        for queries, top_k in payloads:
            part = hits[start:start + len(queries)]
            start += len(queries)
            out.append([[{"rank": h.rank, "score": h.score, "id": h.id, "text": h.text} for h in q[:top_k]]
                        for q in part])
        return out
