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
budget — what :class:`Predictor` (a task model loaded and prepared once, predictions of inputs in
memory; ``qkv serve``'s ``/v1/classify``) and :func:`predict_file` (``qkv predict``: a fine-tuned
run, or any folder with a task head, and new inputs → a JSONL file of predictions, written
atomically) use.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from qkv.finetune.encode import Encoded, eval_batches
from qkv.data.windows import length_batches
from qkv.nn.packed import PackedBatch
from qkv._fs import atomic_write_text, check_output_path
from qkv.errors import check_device
from qkv.finetune.examples import FinetuneDataError
from qkv.finetune.inputs import read_inputs
from qkv.finetune.inputs import load_task_model
from qkv.inference import check_precision, for_inference_calibrated
from qkv.finetune.encode import encode_sequences, encode_tagged
from tqdm.auto import tqdm

__all__ = ["WindowScores", "score", "score_packed", "example_outputs", "Predictor", "Predictions",
           "predict_file"]


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


@dataclass
class Predictions:
    """What :meth:`Predictor.predict` returns.

    Attributes:
        records: one dict per input, in input order: ``{"label": …, "probabilities": {label: p}}``
            (classification; ``p`` unrounded), ``{"value": …}`` (regression) or ``{"tokens": […],
            "tags": […]}`` (token classification).
        windows: model windows scored.
        long: inputs longer than one window.
        truncated: inputs cut to their first window (settings with ``truncate``).
    """

    records: list[dict]
    windows: int
    long: int
    truncated: int


class Predictor:
    """A task model loaded and prepared for inference once, to predict many inputs in memory
    (``qkv predict`` and ``qkv serve``'s ``/v1/classify`` use it).

    Args:
        run: a fine-tuning run folder (its settings from ``run.json``), any folder with a task head,
            or a :class:`~qkv.checkpoints.io.Pretrained` with one (``qkv.load(folder)``).
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"`` …
        precision: ``"fp32"``, ``"bf16"`` or ``"int8"`` (see :func:`qkv.inference.for_inference`),
            checked against the device before anything is loaded.
        batch_size: at most this many windows per forward pass.
        batch_tokens: at most this many tokens per forward pass (``None``: no token limit).

    Attributes:
        model: the task model prepared for inference.
        tokenizer: its :class:`~qkv.data.tokenizer_facade.TokenizerView`.
        settings: ``task``, ``labels``, ``label_kind``, ``max_len``, ``stride``, ``truncate``
            (see :func:`~qkv.finetune.inputs.load_task_model`).
        task, labels: shortcuts into ``settings``.

    Raises:
        QkvError: a device torch does not have, or a precision not offered on the device.
        FinetuneDataError: not a loadable folder, no task head, or no tokenizer.
    """

    def __init__(self, run, *, device: str = "auto", precision: str = "fp32", batch_size: int = 64,
                 batch_tokens: int | None = 4096):
        check_device(device)  # a device torch does not have: one line, before anything is loaded
        self.device = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                                   ("cpu" if device == "auto" else device))
        check_precision(precision, self.device)  # before any loading
        model, self.tokenizer, self.settings = load_task_model(run)
        self.task, self.labels = self.settings["task"], list(self.settings["labels"])
        self.model = for_inference_calibrated(model.to(self.device), precision, self.tokenizer,
                                              self.settings["max_len"], device=self.device)
        self.batch_size, self.batch_tokens = batch_size, batch_tokens

    def encode(self, inputs: list) -> Encoded:
        """The windows of ``inputs``: texts, or word lists for a token-classification model."""
        meta = self.settings
        if self.task == "token-classification":
            return encode_tagged(self.tokenizer, inputs, [[0] * len(s) for s in inputs], max_len=meta["max_len"])
        return encode_sequences(self.tokenizer, inputs, [0] * len(inputs), max_len=meta["max_len"],
                                stride=meta["stride"], truncate=meta["truncate"])

    def predict(self, inputs: list, *, progress: bool = False) -> Predictions:
        """Predictions for ``inputs`` (texts; word lists for a token-classification model), in order."""
        if not inputs:
            return Predictions([], 0, 0, 0)
        enc = self.encode(inputs)
        scores = score_packed(self.model, enc, task=self.task, batch_size=self.batch_size,
                              batch_tokens=self.batch_tokens, device=self.device, progress=progress)
        outs = example_outputs(enc, scores, self.task)
        as_label = (lambda s: int(s)) if self.settings.get("label_kind") == "int" else (lambda s: s)
        records = []
        for e in range(len(inputs)):
            o = outs[e]
            if self.task == "regression":
                records.append({"value": float(o[0])})
            elif self.task == "token-classification":
                records.append({"tokens": inputs[e], "tags": [self.labels[int(t)] for t in o]})
            else:
                k = int(np.argmax(o))
                records.append({"label": as_label(self.labels[k]),
                                "probabilities": {lab: float(p) for lab, p in zip(self.labels, o)}})
        return Predictions(records, len(enc.ids), enc.long, enc.truncated)


def predict_file(run, input_spec: str, out: str | os.PathLike, *, batch_size: int = 64,
                 text_field: str = "text", tokens_field: str = "tokens", encoding_errors: str = "strict",
                 progress: bool = True,
                 device: str = "auto", precision: str = "fp32", batch_tokens: int | None = 4096,
                 replace: bool = True) -> dict:
    """``qkv predict``: predictions for every input of ``input_spec`` into JSONL ``out``.

    ``run``: a fine-tuning run folder (its settings from ``run.json``), any folder with a task head,
    or a :class:`~qkv.checkpoints.io.Pretrained` with one (``qkv.load(folder)``).

    Input: a text file (one text per line), ``.jsonl``/``.csv``/``.tsv`` with ``text_field`` (label
    fields, if present, are ignored), or for token models a CoNLL file / JSONL with ``tokens_field``.
    Each output line: ``{"id": …, "label": …, "probabilities": {label: p}}`` (classification,
    ``p`` rounded to 6 decimals), ``{"id": …, "value": …}`` (regression) or ``{"id": …, "tokens": […],
    "tags": […]}`` (tokens). The model runs prepared for inference in ``precision`` (``"fp32"``,
    ``"bf16"``, ``"int8"``; see :func:`qkv.inference.for_inference`) on padding-free batches of at most
    ``batch_size`` windows and ``batch_tokens`` tokens (:class:`Predictor`). Returns a summary
    (counts, windows, long inputs). ``replace=False`` refuses an existing ``out`` (the command line's
    default; ``--force`` replaces it).
    """
    check_output_path(out, inputs=(input_spec,), replace=replace)  # before loading anything
    predictor = Predictor(run, device=device, precision=precision, batch_size=batch_size,
                          batch_tokens=batch_tokens)
    ids, inputs = read_inputs(input_spec, predictor.task, text_field=text_field, tokens_field=tokens_field,
                              encoding_errors=encoding_errors)
    if not inputs:
        raise FinetuneDataError(f"{input_spec}: no inputs to predict")
    result = predictor.predict(inputs, progress=progress)
    lines = []
    for rid, rec in zip(ids, result.records):
        if "probabilities" in rec:
            rec = {**rec, "probabilities": {lab: round(p, 6) for lab, p in rec["probabilities"].items()}}
        lines.append(json.dumps({"id": rid, **rec}, ensure_ascii=False))
    out = Path(out)
    if out.is_dir():
        raise FinetuneDataError(f"{out}: is a folder; give the path of the .jsonl file to write")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "".join(line + "\n" for line in lines))
    return {"inputs": len(ids), "windows": result.windows, "long": result.long, "truncated": result.truncated,
            "out": str(out), "task": predictor.task}
