"""Metrics: held-out evaluation of a masked-LM model, the JSONL log, and the curve PNG.

The log ``metrics.jsonl`` is append-only: each record is one line written by a single ``write``
on a file opened with ``O_APPEND``, so a crash can tear at most the last line. Readers skip a torn
last line; a damaged line elsewhere is an error that names the file and the line.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from qkv._fs import atomic_file, atomic_write_text
from qkv.data.masking import IGNORE_INDEX
from qkv.training.distributed import all_sum
from qkv.training.rundir import RunError

__all__ = ["evaluate", "append_metrics", "read_metrics", "parse_metrics", "truncate_metrics", "plot_curve"]


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches, *, device: torch.device, max_batches: int) -> dict:
    """MLM loss, perplexity and masked-token accuracy over held-out batches (all ranks together).

    Also the accuracy of always predicting the most frequent held-out label — the baseline a
    model must beat.
    """
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64)
    correct = torch.zeros((), dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)
    label_counts: dict[int, int] = {}
    for i, batch in enumerate(batches.epoch()):
        if i >= max_batches:
            break
        batch = batch.to(device)
        out = model(batch.input_ids, batch.attention_mask, labels=batch.labels)
        targets = batch.labels[batch.labels != IGNORE_INDEX]  # (N,) in the order of the sparse logits
        n = targets.numel()
        if n == 0:
            continue
        loss_sum += out.loss.double().cpu() * n
        correct += (out.logits.argmax(-1) == targets).sum().double().cpu()
        count += n
        for tok, c in zip(*torch.unique(targets.cpu(), return_counts=True)):
            label_counts[int(tok)] = label_counts.get(int(tok), 0) + int(c)
    model.train(was_training)
    totals = all_sum(torch.stack([loss_sum, correct, count]))
    loss, acc, n = (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item(), int(totals[2].item())
    top = max(label_counts.values()) if label_counts else 0
    top_n = all_sum(torch.tensor(float(top), dtype=torch.float64)).item()  # an upper bound across ranks
    return {"eval_loss": loss, "perplexity": math.exp(min(loss, 50.0)), "accuracy": acc,
            "masked_tokens": n, "most_frequent_accuracy": top_n / max(1, n)}


def append_metrics(path: Path, record: dict) -> None:
    """Append ``record`` as one JSON line, in one ``write`` (crash-safe: whole line or a torn last one).
    A symbolic link at ``path`` is refused (``OSError``), never written through."""
    data = (json.dumps(record) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def parse_metrics(path: Path, *, repair: bool = False) -> list[dict]:
    """The records of a metrics log; a torn last line (a crash mid-append) is skipped.

    Args:
        path: ``metrics.jsonl``.
        repair: also accept a last line that is complete JSON but lacks its newline.

    Raises:
        RunError: a line other than the last is not a JSON object (names the file and line).
    """
    raw = Path(path).read_bytes()
    lines = raw.split(b"\n")
    torn = lines.pop() if lines else b""  # after the last newline: empty, or a torn append
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            row = None
        if not isinstance(row, dict):
            if i == len(lines) and not torn.strip():  # the last line, torn before its newline was lost
                continue
            raise RunError(f"{path}: line {i} is not a JSON object; the log is damaged before its last "
                           "line (fix or delete that line, then --resume)")
        rows.append(row)
    if torn.strip() and repair:
        try:
            row = json.loads(torn)
            if isinstance(row, dict):
                rows.append(row)
        except (ValueError, UnicodeDecodeError):
            pass
    return rows


def truncate_metrics(out: Path, step: int) -> list[dict]:
    """Keep only the metrics of steps ≤ ``step`` (those the resumed run will not log again) of run
    folder ``out``; return them.

    A last line torn by a crash mid-append is dropped (it is always the newest record, which the
    resumed run writes again); a damaged line elsewhere raises :class:`RunError` naming it.
    """
    path = Path(out) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [r for r in parse_metrics(path, repair=True) if r.get("step", 0) <= step]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return rows


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics log (``[]`` when there is none); see :func:`parse_metrics`."""
    path = Path(path)
    if not path.is_file():
        return []
    return parse_metrics(path)


def plot_curve(metrics_path: Path, png_path: Path, title: str = "", *, x: str = "step",
               accuracy_marks: dict[str, float] | None = None, metric: str = "accuracy",
               metric_label: str = "masked-token accuracy", loss_label: str = "MLM loss") -> Path | None:
    """Training loss, held-out loss and a held-out ``metric`` (default masked-token accuracy) against
    step (``x="step"``) or training minutes (``x="minutes"``, from the records' ``elapsed_s``), as a
    PNG; ``accuracy_marks`` draws a labelled horizontal line at each given level of the metric."""
    import matplotlib  # lazy: matplotlib takes 0.4–0.6 s to import (python -X importtime); only plotting needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if x not in ("step", "minutes"):
        raise ValueError(f"x={x!r}: expected 'step' or 'minutes'")
    rows = read_metrics(metrics_path)
    if x == "minutes":
        rows = [dict(r, step=r["elapsed_s"] / 60) for r in rows if "elapsed_s" in r]
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    held = [(r["step"], r["eval_loss"], r[metric]) for r in rows
            if "eval_loss" in r and isinstance(r.get(metric), (int, float))]
    if not train and not held:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        ax.plot(*zip(*train), lw=1, alpha=0.8, label="training loss")
    if held:
        s, l, a = zip(*held)
        ax.plot(s, l, "o-", label="held-out loss")
        ax2 = ax.twinx()
        ax2.plot(s, a, "s--", color="tab:green", label=f"held-out {metric_label}")
        ax2.set_ylabel(metric_label)
        marks = accuracy_marks or {}
        for label, level in marks.items():
            ax2.axhline(level, color="tab:gray", ls=":", lw=1)
            ax2.annotate(label, (s[0], level), textcoords="offset points", xytext=(2, 3), fontsize=7,
                         color="tab:gray")
        ax2.set_ylim(min(0, *a), max([*a, *marks.values()]) * 1.2 + 1e-9)
        ax2.legend(loc="center right")
    ax.set_xlabel("step" if x == "step" else "training minutes")
    ax.set_ylabel(loss_label)
    ax.set_title(title)
    ax.legend(loc="upper right")
    fig.tight_layout()
    with atomic_file(png_path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return Path(png_path)
