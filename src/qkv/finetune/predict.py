"""Scoring windows with a task model and turning window outputs into example predictions.

Legend: N windows, E examples, L labels.

* sequence classification: an example's class probabilities are the mean of its windows'
  softmax probabilities ``(E, L)``; its label is the most probable one;
* regression: the mean of its windows' outputs ``(E,)``;
* token classification: each window's logits at the first piece of each word, argmax, the
  windows of a sentence concatenated in order → one tag id per word.

:func:`score` runs the model as it trains (padded batches, with the loss: evaluation during
fine-tuning); :func:`score_packed` runs a model prepared for inference
(:func:`qkv.inference.for_inference`, any precision) on padding-free batches of at most a token
budget — what :func:`predict_file` (``qkv predict``: a fine-tuned run, or any folder with a task
head, and new inputs → a JSONL file of predictions, written atomically) uses.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from qkv.finetune.encode import Encoded, eval_batches

__all__ = ["WindowScores", "score", "score_packed", "example_outputs", "predict_file"]


class WindowScores:
    """Per-window outputs: ``probs`` ``(N, L)`` / ``values`` ``(N,)`` / ``tags`` (list of ``(words,)``
    arrays), and the mean loss over the scored units (``None`` without targets)."""

    def __init__(self):
        self.probs: dict[int, np.ndarray] = {}
        self.tags: dict[int, np.ndarray] = {}
        self.loss_sum, self.units = 0.0, 0

    @property
    def loss(self) -> float | None:
        return self.loss_sum / self.units if self.units else None


@torch.no_grad()
def score(model, enc: Encoded, *, task: str, batch_size: int, device, pad_id: int, rows=None,
          with_loss: bool = True, progress: bool = False, desc: str = "scoring") -> WindowScores:
    """Run ``model`` (eval mode, restored after) over the windows ``rows`` of ``enc`` (default all)."""
    from tqdm.auto import tqdm

    regression = task == "regression"
    was_training = model.training
    model.eval()
    out = WindowScores()
    n_rows = len(enc.ids) if rows is None else len(rows)
    bar = tqdm(total=n_rows, disable=not progress, unit="win", desc=desc, dynamic_ncols=True, leave=False)
    try:
        for b in eval_batches(enc, batch_size, pad_id=pad_id, regression=regression, rows=rows):
            b = b.to(device)
            res = model(b.input_ids, b.attention_mask, labels=b.labels if with_loss else None)
            logits = res.logits.float()
            if with_loss:
                units = int((b.labels != -100).sum()) if task == "token-classification" else len(b.rows)
                if units:
                    out.loss_sum += float(res.loss) * units
                    out.units += units
            if task == "token-classification":
                pred = logits.argmax(-1).cpu().numpy()  # (B,T)
                for i, r in enumerate(b.rows):
                    out.tags[int(r)] = pred[i, enc.word_first[r]]  # (words in window,)
            elif regression:
                vals = logits[:, 0].cpu().numpy()  # (B,1) -> (B,)
                for i, r in enumerate(b.rows):
                    out.probs[int(r)] = vals[i:i + 1]
            else:
                p = torch.softmax(logits, dim=-1).cpu().numpy()  # (B,L)
                for i, r in enumerate(b.rows):
                    out.probs[int(r)] = p[i]
            bar.update(len(b.rows))
    finally:
        bar.close()
        model.train(was_training)
    return out


@torch.inference_mode()
def score_packed(model, enc: Encoded, *, task: str, batch_size: int = 256, batch_tokens: int | None = 4096,
                 device="cpu", progress: bool = False, desc: str = "predicting") -> WindowScores:
    """Run a task model (``forward_packed``; prepared for inference, or in eval mode) over every window
    of ``enc`` without padding: batches of similar length, at most ``batch_size`` windows and
    ``batch_tokens`` tokens (a longer window alone). No loss. Same outputs as :func:`score` up to
    float rounding (and the precision the model was prepared in)."""
    from tqdm.auto import tqdm

    from qkv.data.windows import length_batches
    from qkv.nn.packed import PackedBatch

    out = WindowScores()
    bar = tqdm(total=len(enc.ids), disable=not progress, unit="win", desc=desc, dynamic_ncols=True, leave=False)
    try:
        for rows in length_batches(enc.lengths, batch_size, batch_tokens):
            packed = PackedBatch.from_sequences([enc.ids[r] for r in rows], device=device)
            logits = model.forward_packed(packed).logits.float()  # (B,L), (B,1) or (N,L)
            if task == "token-classification":
                pred = logits.argmax(-1).cpu().numpy()  # (N,)
                starts = packed.starts.cpu().numpy()  # (B,)
                for i, r in enumerate(rows):
                    out.tags[int(r)] = pred[starts[i] + enc.word_first[r]]  # (words in window,)
            elif task == "regression":
                vals = logits[:, 0].cpu().numpy()  # (B,1) -> (B,)
                for i, r in enumerate(rows):
                    out.probs[int(r)] = vals[i:i + 1]
            else:
                p = torch.softmax(logits, dim=-1).cpu().numpy()  # (B,L)
                for i, r in enumerate(rows):
                    out.probs[int(r)] = p[i]
            bar.update(len(rows))
    finally:
        bar.close()
    return out


def example_outputs(enc: Encoded, scores: WindowScores, task: str, examples=None) -> dict[int, np.ndarray]:
    """Example index → mean window probabilities ``(L,)`` / mean value ``(1,)`` / tag ids ``(words,)``,
    for the examples whose windows were all scored (``examples``: only these)."""
    wanted = None if examples is None else set(int(e) for e in examples)
    parts: dict[int, list[np.ndarray]] = {}
    source = scores.tags if task == "token-classification" else scores.probs
    for r in sorted(source):  # window order: a sentence's windows are consecutive
        e = int(enc.example[r])
        if wanted is None or e in wanted:
            parts.setdefault(e, []).append(source[r])
    if task == "token-classification":
        return {e: np.concatenate(p) for e, p in parts.items()}
    return {e: np.mean(np.stack(p), axis=0) for e, p in parts.items()}


def predict_file(run, input_spec: str, out: str | os.PathLike, *, batch_size: int = 64,
                 text_field: str = "text", tokens_field: str = "tokens", progress: bool = True,
                 device: str = "auto", precision: str = "fp32", batch_tokens: int | None = 4096) -> dict:
    """``qkv predict``: predictions for every input of ``input_spec`` into JSONL ``out``.

    ``run``: a fine-tuning run folder (its settings from ``run.json``), any folder with a task head,
    or a :class:`~qkv.models.io.Pretrained` with one (``qkv.load(folder)``).

    Input: a text file (one text per line), ``.jsonl``/``.csv``/``.tsv`` with ``text_field`` (label
    fields, if present, are ignored), or for token models a CoNLL file / JSONL with ``tokens_field``.
    Each output line: ``{"id": …, "label": …, "probabilities": {label: p}}`` (classification),
    ``{"id": …, "value": …}`` (regression) or ``{"id": …, "tokens": […], "tags": […]}`` (tokens).
    The model runs prepared for inference in ``precision`` (``"fp32"``, ``"bf16"``, ``"int8"``; see
    :func:`qkv.inference.for_inference`) on padding-free batches of at most ``batch_size`` windows
    and ``batch_tokens`` tokens. Returns a summary (counts, windows, long inputs).
    """
    from qkv._fs import atomic_write_text
    from qkv.finetune.encode import encode_sequences, encode_tagged
    from qkv.finetune.examples import FinetuneDataError
    from qkv.finetune.inputs import load_task_model, read_inputs

    from qkv.inference import check_precision, for_inference_calibrated

    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    check_precision(precision, dev)  # before any loading
    model, tok, meta = load_task_model(run)
    task = meta["task"]
    labels = list(meta["labels"])
    model = for_inference_calibrated(model.to(dev), precision, tok, meta["max_len"], device=dev)
    ids, inputs = read_inputs(input_spec, task, text_field=text_field, tokens_field=tokens_field)
    if not inputs:
        raise FinetuneDataError(f"{input_spec}: no inputs to predict")
    max_len, stride = meta["max_len"], meta["stride"]
    if task == "token-classification":
        enc = encode_tagged(tok, inputs, [[0] * len(s) for s in inputs], max_len=max_len)
    else:
        enc = encode_sequences(tok, inputs, [0] * len(inputs), max_len=max_len, stride=stride,
                               truncate=meta["truncate"])
    scores = score_packed(model, enc, task=task, batch_size=batch_size, batch_tokens=batch_tokens, device=dev,
                          progress=progress)
    outs = example_outputs(enc, scores, task)
    as_label = (lambda s: int(s)) if meta.get("label_kind") == "int" else (lambda s: s)
    lines = []
    for e, rid in enumerate(ids):
        o = outs[e]
        if task == "regression":
            rec = {"id": rid, "value": float(o[0])}
        elif task == "token-classification":
            rec = {"id": rid, "tokens": inputs[e], "tags": [labels[int(t)] for t in o]}
        else:
            k = int(np.argmax(o))
            rec = {"id": rid, "label": as_label(labels[k]),
                   "probabilities": {lab: round(float(p), 6) for lab, p in zip(labels, o)}}
        lines.append(json.dumps(rec, ensure_ascii=False))
    out = Path(out)
    if out.is_dir():
        raise FinetuneDataError(f"{out}: is a folder; give the path of the .jsonl file to write")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "".join(line + "\n" for line in lines))
    return {"inputs": len(ids), "windows": len(enc.ids), "long": enc.long, "truncated": enc.truncated,
            "out": str(out), "task": task}
