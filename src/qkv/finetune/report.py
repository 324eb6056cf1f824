"""The end of a fine-tuning run: the whole held-out split scored, the baselines, the report files.

Writes (each atomically) ``report.json`` (every figure), ``report.md`` (the tables),
``confusion.png`` (classification) and ``eval_predictions.jsonl``; prints the tables; adds a summary
to ``run.json``; warns (stderr, ``report.json``'s ``warnings``) when the fine-tuned model scores
below a baseline it was compared with. Nothing here selects a model on the held-out data: the model scored is the one
at the end of training.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from qkv._fs import atomic_write_text
from qkv.finetune.baselines import frozen_baseline, tfidf_baseline, word_tag_baseline
from qkv.finetune.metrics import format_classification, format_regression, format_token
from qkv.finetune.metrics import plot_confusion
from qkv.training.rundir import update_run
from qkv.finetune.baselines import paired

__all__ = ["final_report", "below_baselines"]

#: task → (the headline figure compared with the baselines, whether higher is better)
HEADLINE = {"sequence-classification": ("accuracy", True), "token-classification": ("entity_f1", True),
            "regression": ("rmse", False)}


def below_baselines(task: str, report: dict, baselines: dict[str, dict]) -> str | None:
    """The warning for a fine-tuned model that scores below a baseline on the task's headline figure
    (:data:`HEADLINE`), naming each such baseline and its figure; ``None`` when it is not below any."""
    key, higher = HEADLINE[task]
    mine = report.get(key)
    if mine is None:
        return None
    worse = {n: b[key] for n, b in baselines.items() if b.get(key) is not None
             and (b[key] > mine if higher else b[key] < mine)}
    if not worse:
        return None
    which = "every baseline" if len(worse) == len(baselines) else "a baseline"
    names = "; ".join(f"{n} {v:.4f}" for n, v in worse.items())
    return (f"the fine-tuned model ({key} {mine:.4f}) scored below {which} it was compared with ({names}): it "
            f"learned less than they did — train longer (--epochs, --steps or --time-budget), try another --lr, "
            f"or start from a pretrained model")


def _baselines(cfg, train, held, train_t, held_t, labels, stride: int) -> dict[str, dict]:
    out: dict[str, dict] = {}
    if cfg.task == "token-classification":
        if "word-tag" in cfg.baselines:
            out["most frequent tag per word"] = word_tag_baseline(train.inputs, train.targets, held.inputs,
                                                                  held.targets)
        return out
    if "tfidf" in cfg.baselines:
        out["TF-IDF + " + ("ridge" if cfg.task == "regression" else "logistic regression")] = tfidf_baseline(
            train.inputs, train_t, held.inputs, held_t, task=cfg.task, labels=labels)
    if "frozen" in cfg.baselines:
        out["frozen mean-pooled vectors + " + ("ridge" if cfg.task == "regression" else "logistic regression")] = \
            frozen_baseline(cfg.model, train.inputs, train_t, held.inputs, held_t, task=cfg.task, labels=labels,
                            max_len=cfg.max_len, stride=stride, truncate=cfg.truncate,
                            batch_size=cfg.eval_batch_size, progress=cfg.progress)
    return out


def _model_name(path: str) -> str:
    """A folder's name for a title; a generic one (``model``) with its parent's (``pkg/model``)."""
    p = Path(path).resolve()
    return f"{p.parent.name}/{p.name}" if p.name in ("model", "hf", "out", "final") else p.name


def _format(task: str, report: dict, baselines: dict[str, dict]) -> str:
    if task == "regression":
        return format_regression(report, baselines=baselines)
    if task == "token-classification":
        lines = [format_token(report)]
        for name, rep in baselines.items():
            lines.append(f"\nbaseline — {name}:\n{format_token(rep)}")
        return "\n".join(lines)
    return format_classification(report, baselines=baselines)


def _predictions(task: str, held, held_t, outputs: dict, labels, kind: str) -> str:
    as_label = (lambda s: int(s)) if kind == "int" else (lambda s: s)
    lines = []
    for e, src in enumerate(held.sources):
        o = outputs[e]
        if task == "regression":
            rec = {"source": src, "target": float(held_t[e]), "value": float(o[0])}
        elif task == "token-classification":
            rec = {"source": src, "tokens": held.inputs[e], "tags": list(held.targets[e]),
                   "predicted": [labels[int(t)] for t in o]}
        else:
            k = int(np.argmax(o))
            rec = {"source": src, "label": as_label(labels[held_t[e]]), "predicted": as_label(labels[k]),
                   "probability": round(float(o[k]), 6)}
        lines.append(json.dumps(rec, ensure_ascii=False))
    return "".join(line + "\n" for line in lines)


def final_report(cfg, objective, model, train, held, train_t, held_t, labels, kind: str, out: Path, *,
                 train_seconds: float, notes: list[str], stride: int) -> dict:
    """Score everything held out, run the baselines, write the report files; return the report."""
    t0 = time.perf_counter()
    every = np.arange(len(held))
    ev = objective.evaluate(model, rows=np.arange(len(objective.held.ids)), examples=every, progress=cfg.progress)
    report = dict(ev["report"], eval_loss=ev["eval_loss"])
    eval_s = time.perf_counter() - t0
    baselines = _baselines(cfg, train, held, train_t, held_t, list(labels), stride)
    result = {"task": cfg.task, "model": cfg.model, "train": list(cfg.train), "held_out_examples": len(held),
              "train_examples": len(train), "train_seconds": round(float(train_seconds), 1),
              "eval_seconds": round(eval_s, 1), "fine_tuned": report, "baselines": baselines, "notes": notes}
    if cfg.task == "sequence-classification":
        mine = [int(np.argmax(ev["outputs"][e])) for e in range(len(held))]
        for b in baselines.values():
            b["paired"] = paired(held_t, mine, b.pop("predictions"))
    warning = below_baselines(cfg.task, report, baselines)
    if warning:
        result["warnings"] = [warning]
    text = _format(cfg.task, report, baselines)
    for name, b in baselines.items():
        if "paired" in b:
            pr = b["paired"]
            text += (f"\nvs {name}: only the model right on {pr['model_only']}, only the baseline on "
                     f"{pr['baseline_only']} of {len(held)} (exact McNemar p = {pr['p_value']:.3g})")
    if cfg.task == "sequence-classification":
        plot_confusion(report["confusion"], list(labels), out / "confusion.png",
                       title=f"{_model_name(cfg.model)} fine-tuned on {', '.join(cfg.train)} — held out")
    atomic_write_text(out / "eval_predictions.jsonl", _predictions(cfg.task, held, held_t, ev["outputs"], labels, kind))
    atomic_write_text(out / "report.json", json.dumps(result, indent=1))
    md = [f"# Fine-tuning report: {cfg.task}", "", f"- model: `{cfg.model}`", f"- training data: "
          f"{', '.join(cfg.train)} ({len(train)} examples); held out: {len(held)} examples",
          f"- training time {result['train_seconds']:.0f} s; held-out scoring {eval_s:.0f} s",
          *[f"- note: {n}" for n in notes], "", "```", text, "```", ""]
    atomic_write_text(out / "report.md", "\n".join(md))
    headline = {k: report[k] for k in ("accuracy", "macro_f1", "rmse", "pearson", "spearman", "token_accuracy",
                                       "entity_f1") if k in report}
    update_run(out, report=headline, baselines={n: {k: b[k] for k in headline if k in b}
                                                for n, b in baselines.items()})
    print(text, flush=True)
    if warning:
        print(f"qkv: warning: {warning}", file=sys.stderr, flush=True)
    return result
