"""``finetune(config)``: a task head on a pretrained encoder, trained by the shared engine.

Order of work: read and check every input (data, labels, model, window) — each problem one clear
error before anything is written — then create the run folder atomically, then train with
:func:`qkv.training.engine.run_training` (schedule by steps/epochs or a time budget, checkpoints,
``--resume``, bf16, threads, progress bar, ``metrics.jsonl`` and ``curve.png``), then score the
whole held-out split, the baselines on the same split, and write the report.

Run folder::

    run.json            configs, task settings (labels, windows), data summary, status, report summary
    tokenizer.json      the tokenizer
    metrics.jsonl       training loss; held-out loss and scores on a fixed sample during training
    curve.png           the curve
    checkpoints/        see qkv.training.checkpoint
    qkv.json, model.safetensors   the fine-tuned model (``qkv.load(run)``; ``qkv predict run …``)
    report.json / report.md        the full held-out evaluation and the baselines
    confusion.png       confusion matrix (classification)
    eval_predictions.jsonl          one line per held-out example: target and prediction
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from qkv.finetune.config import FinetuneConfig
from qkv.finetune.encode import TaskBatches, encode_sequences, encode_tagged
from qkv.finetune.examples import Examples, FinetuneDataError, label_set, read_examples, split_examples, subsample
from qkv.data.tokenizer_facade import TokenizerFile
from qkv.finetune.predict import example_outputs, score
from qkv.training.engine import run_training
from qkv.training.lifecycle import RunFolder, check_resume_data, resume_eval, run_session
from qkv.training.objective import save_final_model
from qkv.training.precision import resolve_precision
from qkv.training.rundir import RunError
from qkv.errors import CheckpointError
from qkv.checkpoints.families import task_head
from qkv.checkpoints.bundled import model_folder
from qkv.checkpoints.io import load
from qkv.embeddings.embedder import folder_defaults
from qkv.finetune.metrics import classification_report, regression_report, token_report
from qkv.data.tokenizer_facade import TokenizerView, no_tokenizer
from qkv.models.task_builders import attach_task_head
from qkv.models.heads import TaskConfig
from qkv.finetune.report import final_report
from qkv.models.kinds import model_kind

__all__ = ["finetune", "FinetuneResult"]


@dataclass
class FinetuneResult:
    """A finished or interrupted fine-tuning run: ``report`` is the full held-out evaluation with
    its ``baselines`` (``None`` when interrupted)."""

    out: Path
    steps_done: int
    status: str
    report: dict | None


def _read_split(specs, cfg: FinetuneConfig) -> Examples:
    ex = Examples()
    for spec in specs:
        ex.extend(read_examples(spec, cfg.task, text_field=cfg.text_field, label_field=cfg.label_field,
                                tokens_field=cfg.tokens_field, tags_field=cfg.tags_field,
                                encoding_errors=cfg.encoding_errors))
    return ex


def _data(cfg: FinetuneConfig) -> tuple[Examples, Examples, list[str]]:
    train = _read_split(cfg.train, cfg)
    if cfg.eval is not None:
        held = _read_split(cfg.eval, cfg)
    elif len(cfg.train) == 1 and cfg.train[0].startswith("dataset:") and cfg.train[0].split(":")[2:] in ([], ["train"]):
        held = _read_split([f"dataset:{cfg.train[0].split(':')[1]}:test"], cfg)
        held.notes.append(f"held-out data: the named test split of {cfg.train[0]}")
    else:
        train, held = split_examples(train, cfg.eval_fraction, cfg.seed)
    train = subsample(train, cfg.max_train, cfg.seed, "train")
    held = subsample(held, cfg.max_eval, cfg.seed + 1, "held-out")
    return train, held, train.notes + held.notes


def _targets(ex: Examples, cfg: FinetuneConfig, labels) -> list:
    if cfg.task == "regression":
        return [float(t) for t in ex.targets]
    index = {lab: i for i, lab in enumerate(labels)}
    if cfg.task == "token-classification":
        return [[index[t] for t in tags] for tags in ex.targets]
    return [index[str(t)] for t in ex.targets]


def _encode(tok, ex: Examples, targets, cfg: FinetuneConfig, stride: int):
    if cfg.task == "token-classification":
        return encode_tagged(tok, ex.inputs, targets, max_len=cfg.max_len)
    return encode_sequences(tok, ex.inputs, targets, max_len=cfg.max_len, stride=stride, truncate=cfg.truncate)


def _fingerprint(*splits: Examples) -> str:
    h = hashlib.sha256(b"qkv-finetune-data:v1\0")
    for ex in splits:
        for inp, t in zip(ex.inputs, ex.targets):
            h.update(json.dumps([inp, t], ensure_ascii=False).encode("utf-8") + b"\0")
        h.update(b"\1")
    return h.hexdigest()


def _starting_model(cfg: FinetuneConfig):
    if not model_folder(cfg.model).is_dir():
        raise FinetuneDataError(f"{cfg.model}: not a folder; give a qkv model or run folder, or a Hugging Face "
                                "BERT folder")
    overrides = {k: getattr(cfg, k) for k in ("dropout", "attention_dropout") if getattr(cfg, k) is not None}
    try:
        loaded = load(cfg.model, **overrides)  # (model, tokenizer)
    except CheckpointError as e:
        raise FinetuneDataError(f"cannot load the model to fine-tune: {e}") from None
    kind = model_kind(loaded.model)[1]
    if kind in ("causal_lm", "encoder_decoder"):
        what = {"causal_lm": "a causal language model (GPT-style)", "encoder_decoder": "an encoder-decoder"}[kind]
        raise FinetuneDataError(f"{cfg.model} is {what}; qkv finetune trains a task head on an encoder — give an "
                                "encoder, masked-LM or task-model folder (e.g. one qkv pretrain wrote without "
                                "--objective clm, or a BERT-family Hugging Face folder)")
    if kind.startswith("image"):  # before the tokenizer: copying one in would not make it read text
        raise FinetuneDataError(f"{cfg.model} is an image model; qkv finetune trains a task head on a text encoder "
                                "(an image classifier trains with qkv pretrain --objective image)")
    return loaded


def _head_shape(cfg: FinetuneConfig, model, head: TaskConfig | None) -> dict:
    """``pooling``, ``head``, ``head_norm`` of the task head: the starting model's own head for the same
    task, else its family's (:func:`qkv.checkpoints.families.task_head`); ``--pooling`` replaces the
    pooling (and the family's map before the classifier)."""
    sequence = cfg.task != "token-classification"
    own = head if head is not None and head.task == cfg.task and not cfg.reset_head else None
    if own is not None and (cfg.pooling is None or cfg.pooling == own.pooling or not sequence):
        return {"pooling": own.pooling, "head": own.head, "head_norm": own.head_norm}
    if cfg.pooling is not None and sequence:
        return {"pooling": cfg.pooling}
    return {"pooling": "pooler", **task_head(model.config, sequence)}


def _window(cfg: FinetuneConfig, model) -> FinetuneConfig:
    """``max_len`` made explicit and checked against the model (and stride against it)."""
    limit = model.config.max_len
    if cfg.max_len is None:
        trained = folder_defaults(cfg.model).get("max_len") if Path(cfg.model).is_dir() else None
        cfg = cfg.replace(max_len=min(128, limit, trained or limit))
    if cfg.max_len > limit:
        raise FinetuneDataError(f"max_len={cfg.max_len} exceeds the model's window ({limit}); use "
                                f"--max-len {limit} or less")
    if cfg.stride is not None and cfg.stride > cfg.max_len - 2:
        raise FinetuneDataError(f"stride={cfg.stride} must be ≤ max_len − 2 = {cfg.max_len - 2}")
    return cfg


def _resolve(cfg: FinetuneConfig, per_epoch: int) -> FinetuneConfig:
    """Steps, warm-up and evaluation/checkpoint intervals made explicit (stored in run.json)."""
    steps_per_epoch = max(1, math.ceil(per_epoch / cfg.grad_accum))
    timed = cfg.time_budget is not None  # a timed run stops at its deadline: no step count
    steps = None if timed else (cfg.steps or max(1, math.ceil(cfg.epochs * steps_per_epoch)))
    span = steps_per_epoch if timed else steps
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else round(0.1 * span)
    every = cfg.eval_every or max(1, math.ceil(span / 4))
    return cfg.replace(steps=steps, warmup_steps=warmup, eval_every=every, save_every=cfg.save_every or every)


class TaskObjective:
    """Cross-entropy (classification, per window or per labelled token) or MSE (regression); held out:
    the same loss and the task's scores on a fixed sample of examples."""

    loss_label = "loss"

    def __init__(self, task: str, batches: TaskBatches, held, labels, *, device, pad_id: int, batch_size: int,
                 sample: np.ndarray, held_targets):
        self.task, self.batches, self.held, self.labels = task, batches, held, labels
        self.device, self.pad_id, self.batch_size = device, pad_id, batch_size
        self.sample, self.held_targets = sample, held_targets
        self.rows = np.flatnonzero(np.isin(held.example, sample))
        self.metric, self.metric_label = {"regression": ("pearson", "Pearson r"),
                                          "token-classification": ("entity_f1", "entity F1")}.get(
            task, ("accuracy", "accuracy"))

    def batch(self, index: int):
        return self.batches.batch(index)

    def units(self, batch) -> torch.Tensor:
        if self.task == "token-classification":
            return (batch.labels != -100).sum()
        return torch.tensor(batch.labels.shape[0])

    def loss(self, model, batch) -> torch.Tensor:
        return model(batch.input_ids, batch.attention_mask, labels=batch.labels).loss

    def evaluate(self, model, *, rows=None, examples=None, progress: bool = False) -> dict:
        examples = self.sample if examples is None else examples
        scores = score(model, self.held, task=self.task, batch_size=self.batch_size, device=self.device,
                       pad_id=self.pad_id, rows=self.rows if rows is None else rows, progress=progress,
                       desc="held-out")
        outs = example_outputs(self.held, scores, self.task, examples)
        rep = report_for(self.task, self.labels, [self.held_targets[e] for e in examples],
                         [outs[int(e)] for e in examples])
        keys = {"regression": ("rmse", "pearson", "spearman"),
                "token-classification": ("token_accuracy", "entity_f1")}.get(self.task, ("accuracy", "macro_f1"))
        out = {"eval_loss": scores.loss, **{k: rep[k] for k in keys}, "examples": len(examples)}
        if self.task == "token-classification":
            out["accuracy"] = rep["token_accuracy"]
        return out if rows is None else {**out, "report": rep, "outputs": outs}

    def describe(self, ev: dict) -> str:
        parts = [f"{k} {ev[k]:.4f}" for k in ("eval_loss", "accuracy", "macro_f1", "rmse", "pearson", "entity_f1")
                 if isinstance(ev.get(k), float)]
        return f"held-out ({ev['examples']} examples) " + ", ".join(parts)

    def save(self, model, out: Path) -> None:
        save_final_model(model, out)


def report_for(task: str, labels, targets, outputs) -> dict:
    """The metrics report of example ``outputs`` (probabilities, values or tag ids) against ``targets``."""
    if task == "regression":
        return regression_report([float(t) for t in targets], [float(o[0]) for o in outputs])
    if task == "token-classification":
        return token_report([[labels[t] for t in tt] for tt in targets], [[labels[int(p)] for p in o] for o in outputs])
    return classification_report([int(t) for t in targets], [int(np.argmax(o)) for o in outputs], labels)


def finetune(cfg: FinetuneConfig, *, resume: bool = False, clock=time.monotonic, on_backward=None) -> FinetuneResult:
    """Fine-tune as ``cfg`` says (see the module docstring); ``resume`` continues the run in ``cfg.out``.
    ``clock`` and ``on_backward``: as in :func:`qkv.training.engine.run_training` (for tests)."""
    with run_session(cfg.device, cfg.out, resume=resume) as (info, run):
        if resume and (done := _finished(run, cfg)) is not None:
            return done
        precision, note = resolve_precision(cfg.precision, info.device)
        if note and info.is_main:
            print(f"qkv finetune: {note}", flush=True)
        return _run(cfg, run, info, precision, clock, on_backward)


def _finished(run: RunFolder, cfg: FinetuneConfig) -> FinetuneResult | None:
    meta = run.meta()
    stored = FinetuneConfig.from_dict({**meta["train_config"], "out": cfg.out})
    resolved = cfg.replace(**{k: getattr(stored, k) if getattr(cfg, k) is None else getattr(cfg, k)
                              for k in ("steps", "warmup_steps", "eval_every", "save_every", "max_len")})
    if run.finished(resolved, files=("qkv.json", "model.safetensors", "report.json")) is None:
        return None
    report = json.loads((run.out / "report.json").read_text(encoding="utf-8"))
    return FinetuneResult(run.out, int(meta.get("steps_done", 0)), "complete", report)


def _run(cfg: FinetuneConfig, run: RunFolder, info, precision: str, clock, on_backward) -> FinetuneResult:
    train, held, notes = _data(cfg)
    model, tokenizer = _starting_model(cfg)
    head = getattr(model, "task", None)
    if cfg.task == "regression":
        labels, kind = (), "float"
    else:
        same = head is not None and head.task == cfg.task and not cfg.reset_head
        labels, kind = label_set(train, held, cfg.task, given=cfg.labels, head=head.labels if same else None)
    cfg = _window(cfg, model)
    task = TaskConfig(task=cfg.task, labels=tuple(labels), classifier_dropout=cfg.classifier_dropout,
                      **_head_shape(cfg, model, head))
    if tokenizer is None:
        raise no_tokenizer(f"model folder {cfg.model}", error=FinetuneDataError)
    model = attach_task_head(model, task, seed=cfg.seed, reset_head=cfg.reset_head)
    tok = TokenizerView(tokenizer, error=FinetuneDataError)
    stride = cfg.stride or max(1, 3 * (cfg.max_len - 2) // 4)
    tag_labels = labels if cfg.task == "token-classification" else None
    train_t, held_t = _targets(train, cfg, tag_labels or labels), _targets(held, cfg, tag_labels or labels)
    train_enc, held_enc = _encode(tok, train, train_t, cfg, stride), _encode(tok, held, held_t, cfg, stride)
    batches = TaskBatches(train_enc, cfg.batch_size, seed=cfg.seed, pad_id=tok.pad_id,
                          regression=cfg.task == "regression", rank=info.rank, world_size=info.world_size)
    stored_cfg = cfg
    cfg = _resolve(cfg, batches.per_epoch)
    settings = {"task": cfg.task, "labels": list(labels), "label_kind": kind, "max_len": cfg.max_len,
                "stride": stride, "truncate": cfg.truncate}
    summary = {"train_examples": len(train), "train_windows": len(train_enc.ids), "held_out_examples": len(held),
               "held_out_windows": len(held_enc.ids), "long_train": train_enc.long, "long_held_out": held_enc.long,
               "truncated_train": train_enc.truncated, "truncated_held_out": held_enc.truncated,
               "steps_per_epoch": math.ceil(batches.per_epoch / cfg.grad_accum), "notes": notes}
    fingerprint = _fingerprint(train, held)
    out = run.out
    if run.resume:
        check_resume_data(run, cfg, fingerprint, same="files", detail=" (their sha256 does not match run.json)",
                          error=RunError)
    else:
        meta = {"kind": "finetune", "train_config": cfg.to_dict(), "model_config": model.config.to_dict(),
                "finetune": settings, "data": summary, "data_sha256": fingerprint, "precision": precision}
        run.create(meta, write=TokenizerFile(tokenizer).save)
    _print_plan(cfg, summary, labels, info, stored_cfg)
    sample = np.sort(np.random.default_rng([cfg.seed, 0xE7A1]).permutation(len(held))[:cfg.eval_sample])
    objective = TaskObjective(cfg.task, batches, held_enc, list(labels), device=info.device, pad_id=tok.pad_id,
                              batch_size=cfg.eval_batch_size, sample=sample, held_targets=held_t)
    t0 = time.perf_counter()
    result = run_training(cfg, objective, model=model, run=run, info=info, precision=precision,
                          title=f"{cfg.task} on {', '.join(cfg.train)}", clock=clock, resume_eval=resume_eval,
                          on_backward=on_backward)
    train_s = time.perf_counter() - t0
    if result.status != "complete" or not info.is_main:
        return FinetuneResult(out, result.steps_done, result.status, None)
    trained = model if result.model is None else result.model.to(info.device)  # fsdp: rank 0's unsharded copy
    report = final_report(cfg, objective, trained, train, held, train_t, held_t, labels, kind, out,
                          train_seconds=run.meta().get("elapsed_s", train_s), notes=notes, stride=stride)
    return FinetuneResult(out, result.steps_done, "complete", report)


def _print_plan(cfg: FinetuneConfig, summary: dict, labels, info, given: FinetuneConfig) -> None:
    if not info.is_main:
        return
    what = f"{len(labels)} labels" if labels else "regression"
    span = (f"{cfg.time_budget:g} min" if cfg.time_budget is not None else
            f"{cfg.steps} steps" + (f" ({given.epochs:g} epochs)" if given.steps is None else ""))
    print(f"qkv finetune: {cfg.task}, {what}; {summary['train_examples']} training examples in "
          f"{summary['train_windows']} windows of ≤ {cfg.max_len} tokens ({summary['long_train']} long "
          f"{'cut to one window' if cfg.truncate else 'in several windows'}), {summary['held_out_examples']} "
          f"held out; {span}, batch {cfg.batch_size}×{cfg.grad_accum}, lr {cfg.lr:g}", flush=True)
    for note in summary["notes"]:
        print(f"  note: {note}", flush=True)
