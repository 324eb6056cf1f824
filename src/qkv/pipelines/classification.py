"""``qkv.pipeline("text-classification" | "token-classification", model)``: a task model's labels for texts
in memory, in the shape of ``transformers``' pipelines.

Legend: N tokens of a packed batch, B windows in it, L labels.

**Text classification.** A text runs in the model's windows (:mod:`qkv.data.windows`: every token
seen; a text within the window is one window); its label scores are the mean over its windows of
softmax of the logits (one logit — regression — through a sigmoid, as ``transformers`` does).
Per text: ``{"label", "score"}`` of the best label (``top_k=1``, the default; a list of one for a
single text, as ``transformers`` gives), or a list of the ``top_k`` best (``top_k=None``: every label).

**Token classification.** Every token of a text gets the softmax of its logits; a long text runs in
consecutive windows, each token once. Per text, ``aggregation_strategy="none"`` (default): one dict
``{"entity", "score", "index", "word", "start", "end"}`` per token whose label is not ``O``
(``index`` the token's position in the text's input with its special tokens, ``word`` the token,
``start``/``end`` character offsets); ``"simple"``: neighbouring tokens of one entity type (``B-X``
starts one, ``I-X`` or ``X`` continues it) grouped as ``{"entity_group", "score" (the mean), "word",
"start", "end"}``.
"""

from __future__ import annotations

import numpy as np
import torch

from qkv.data.windows import make_windows
from qkv.models.task_models import SequenceClassifier, TokenClassifier
from qkv.pipelines.base import Pipeline, PipelineError

__all__ = ["TextClassificationPipeline", "TokenClassificationPipeline"]


def _labels(model) -> list[str]:
    return list(model.task.labels) or ["LABEL_0"]  # regression: transformers' name of its one output


class TextClassificationPipeline(Pipeline):
    """Call options: ``top_k`` (1; ``None``: all labels), ``max_len`` (window, default the model's)."""

    task = "text-classification"

    def check_model(self, model):
        if not isinstance(model, SequenceClassifier):
            raise PipelineError(f"text-classification needs a sequence classifier (a fine-tuned folder: qkv "
                                f"finetune --task sequence-classification), got {type(model).__name__}")
        return model

    def run(self, texts: list[str], *, top_k: int | None = 1, max_len: int | None = None) -> list:
        view = self.tokenizer
        window = min(max_len or self.window(), self.window())
        span = window - view.n_special
        wins = make_windows(view.encode(texts), window=window, stride=max(1, 3 * span // 4), prefix=view.prefix,
                            suffix=view.suffix)
        total = np.zeros((len(texts), len(_labels(self.model))))
        count = np.zeros(len(texts))
        for rows, packed in self.batches(wins.ids):
            logits = self.model.forward_packed(packed).logits.float()  # (B,L)
            p = torch.sigmoid(logits) if logits.shape[-1] == 1 else torch.softmax(logits, dim=-1)
            for i, r in enumerate(rows):
                total[wins.doc[r]] += p[i].cpu().numpy()
                count[wins.doc[r]] += 1
        labels = _labels(self.model)
        out = []
        for scores in total / count[:, None]:
            order = np.argsort(-scores, kind="stable")
            ranked = [{"label": labels[k], "score": float(scores[k])} for k in order]
            out.append(ranked[0] if top_k == 1 else ranked[:top_k] if top_k is not None else ranked)
        return out

    def __call__(self, inputs, **options):
        result = super().__call__(inputs, **options)
        top_k = options.get("top_k", self.defaults.get("top_k", 1))
        return [result] if isinstance(inputs, str) and top_k == 1 else result  # transformers' shape


def _tag(name: str) -> tuple[str, str]:
    if name.startswith(("B-", "I-")):
        return name[0], name[2:]
    return "I", name


class TokenClassificationPipeline(Pipeline):
    """Call options: ``aggregation_strategy`` (``"none"`` or ``"simple"``), ``ignore_labels`` (``["O"]``)."""

    task = "token-classification"

    def check_model(self, model):
        if not isinstance(model, TokenClassifier):
            raise PipelineError(f"token-classification needs a token classifier (a fine-tuned folder: qkv "
                                f"finetune --task token-classification), got {type(model).__name__}")
        return model

    def run(self, texts: list[str], *, aggregation_strategy: str = "none", ignore_labels=("O",)) -> list:
        if aggregation_strategy not in ("none", "simple"):
            raise PipelineError(f"aggregation_strategy={aggregation_strategy!r} is not allowed; allowed: none, simple")
        view = self.tokenizer
        encs = view.backend.encode_batch(texts, add_special_tokens=False)
        ids = [np.asarray(e.ids, dtype=np.int64) for e in encs]
        wins = make_windows(ids, window=self.window(), cover_end=False, skip_empty=True, prefix=view.prefix,
                            suffix=view.suffix)
        probs: list[list[np.ndarray]] = [[] for _ in texts]
        for rows, packed in self.batches(wins.ids):
            p = torch.softmax(self.model.forward_packed(packed).logits.float(), dim=-1).cpu().numpy()  # (N,L)
            starts = packed.starts.tolist()
            for i, r in enumerate(rows):
                probs[wins.doc[r]].append((wins.start[r], p[starts[i] + len(view.prefix): starts[i] + packed.lengths[i]
                                                            - len(view.suffix)]))
        labels = _labels(self.model)
        out = []
        for d, enc in enumerate(encs):
            p = np.concatenate([q for _, q in sorted(probs[d], key=lambda x: x[0])]) if probs[d] else np.zeros((0, 1))
            tokens = []
            for t, (token, (start, end)) in enumerate(zip(enc.tokens, enc.offsets)):
                k = int(p[t].argmax())
                tokens.append({"entity": labels[k], "score": float(p[t, k]), "index": len(view.prefix) + t,
                               "word": token, "start": start, "end": end})
            if aggregation_strategy == "simple":
                tokens = self._group(tokens)
            out.append([e for e in tokens if e.get("entity", e.get("entity_group")) not in ignore_labels])
        return out

    def _group(self, tokens: list[dict]) -> list[dict]:
        groups, run = [], []
        for e in tokens:
            bi, tag = _tag(e["entity"])
            if run and (tag != _tag(run[-1]["entity"])[1] or bi == "B"):
                groups.append(self._merge(run))
                run = []
            run.append(e)
        if run:
            groups.append(self._merge(run))
        return groups

    def _merge(self, run: list[dict]) -> dict:
        decoder = self.tokenizer.backend.decoder
        words = [e["word"] for e in run]
        word = decoder.decode(words) if decoder is not None else " ".join(words)
        return {"entity_group": _tag(run[0]["entity"])[1], "score": float(np.mean([e["score"] for e in run])),
                "word": word, "start": run[0]["start"], "end": run[-1]["end"]}
