"""Metrics: held-out evaluation of a masked-LM model, the JSONL log, and the curve PNG."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from qkv.data.masking import IGNORE_INDEX
from qkv.training.distributed import all_sum

__all__ = ["evaluate", "append_metrics", "read_metrics", "plot_curve"]


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
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def read_metrics(path: Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_curve(metrics_path: Path, png_path: Path, title: str = "", *, x: str = "step",
               accuracy_marks: dict[str, float] | None = None) -> Path | None:
    """Training loss, held-out loss and held-out accuracy against step (``x="step"``) or training
    minutes (``x="minutes"``, from the records' ``elapsed_s``), as a PNG; ``accuracy_marks`` draws a
    labelled horizontal line at each given accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if x not in ("step", "minutes"):
        raise ValueError(f"x={x!r}: expected 'step' or 'minutes'")
    rows = read_metrics(metrics_path)
    if x == "minutes":
        rows = [dict(r, step=r["elapsed_s"] / 60) for r in rows if "elapsed_s" in r]
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    held = [(r["step"], r["eval_loss"], r["accuracy"]) for r in rows if "eval_loss" in r]
    if not train and not held:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        ax.plot(*zip(*train), lw=1, alpha=0.8, label="training loss")
    if held:
        s, l, a = zip(*held)
        ax.plot(s, l, "o-", label="held-out loss")
        ax2 = ax.twinx()
        ax2.plot(s, a, "s--", color="tab:green", label="held-out accuracy")
        ax2.set_ylabel("masked-token accuracy")
        marks = accuracy_marks or {}
        for label, level in marks.items():
            ax2.axhline(level, color="tab:gray", ls=":", lw=1)
            ax2.annotate(label, (s[0], level), textcoords="offset points", xytext=(2, 3), fontsize=7,
                         color="tab:gray")
        ax2.set_ylim(0, max([*a, *marks.values()]) * 1.2 + 1e-9)
        ax2.legend(loc="center right")
    ax.set_xlabel("step" if x == "step" else "training minutes")
    ax.set_ylabel("MLM loss")
    ax.set_title(title)
    ax.legend(loc="upper right")
    fig.tight_layout()
    tmp = Path(png_path).with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(png_path)
    return Path(png_path)
