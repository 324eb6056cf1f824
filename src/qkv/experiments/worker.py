"""One run of a grid: train (or resume) it, then measure it; also a process entry point.

:func:`run_job` trains ``job`` into its run folder with :func:`qkv.training.pretrain` — from
scratch, or with ``resume=True`` when the folder holds an unfinished run — then loads the final
model and writes ``result.json`` next to it: held-out loss and accuracy (the run's last
evaluation), the held-out loss curve, parameters, tokens/s, and the grid's statistics. A run whose
``result.json`` exists is finished; a run that diverges (non-finite loss) is finished too, with
``status: "failed"``, since a rerun would diverge identically.

``python -m qkv.experiments.worker JOB.json --threads N`` does the same in its own process (the
harness's ``--jobs``); it exits 0 when done, 130 when interrupted (SIGINT/SIGTERM: a checkpoint is
saved), 1 on an error, and stops itself when its parent process dies.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from qkv.experiments.plan import Job
from qkv.experiments.reuse import REUSED_KEY
from qkv.experiments.stats import EarlyStats, attention_summary, encoder_attentions, head_summary
from qkv._fs import atomic_write_text
from qkv.experiments.data import corpus_options
from qkv.data.pipeline import prepare_pretraining_data
from qkv.training.loop import TrainingError, pretrain
import qkv
from qkv.training.metrics import read_metrics
from qkv.data.masking import MaskingConfig
from qkv.data.packing import PackedBlocks
from qkv.data.pipeline import MLMBatches
from qkv.training.metrics import evaluate

__all__ = ["run_job", "is_finished", "read_result", "RESULT_JSON", "EARLY_JSON"]

RESULT_JSON = "result.json"
EARLY_JSON = "early_stats.json"
#: Held-out blocks the attention statistics read (the first ones, so every variant sees the same).
PROBE_BLOCKS = 32


def is_finished(job: Job) -> bool:
    return (Path(job.run_dir) / RESULT_JSON).is_file()


def read_result(job: Job) -> dict | None:
    path = Path(job.run_dir) / RESULT_JSON
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _run_state(run_dir: Path) -> str:
    """``new`` (no run yet), ``resume`` (unfinished run) or ``trained`` (final model saved)."""
    meta = run_dir / "run.json"
    if not meta.is_file():
        return "new"
    status = json.loads(meta.read_text(encoding="utf-8")).get("status")
    return "trained" if status == "complete" and (run_dir / "model.safetensors").is_file() else "resume"


def _load_data(cfg):
    """The run's data (caches already built by the harness, so this only opens them)."""
    return prepare_pretraining_data(
        list(cfg.corpus), options=corpus_options(cfg.to_dict()),
        eval_corpus=list(cfg.eval_corpus) if cfg.eval_corpus else None, eval_fraction=cfg.eval_fraction,
        seed=cfg.seed, tokenizer=cfg.tokenizer, max_len=cfg.max_len)


def _probe(blocks, n: int = PROBE_BLOCKS):
    b = blocks.batch(list(range(min(n, len(blocks)))))
    return b.input_ids, b.attention_mask


def run_job(job: Job, *, log=print) -> dict:
    """Train (or resume) and measure ``job``; returns its result (also written to ``result.json``).

    Returns ``{"status": "interrupted", …}`` without a result file when training was interrupted.
    """
    cfg, run_dir = job.config(), Path(job.run_dir)
    data = _load_data(cfg)
    hook = None
    if "saturation" in job.stats:
        hook = EarlyStats(run_dir / EARLY_JSON, *_probe(data.eval), job.early_steps)
    state = _run_state(run_dir)
    t0 = time.perf_counter()
    if state != "trained":
        log(f"{job.label}: {'resuming from its last checkpoint' if state == 'resume' else 'training'}")
        try:
            result = pretrain(cfg, resume=state == "resume", on_backward=hook)
        except TrainingError as e:
            row = {"variant": job.variant, "seed": job.seed, "status": "failed", "error": str(e),
                   **(hook.summary() if hook is not None else {})}
            atomic_write_text(run_dir / RESULT_JSON, json.dumps(row, indent=1))
            return row
        if result.status != "complete":
            return {"variant": job.variant, "seed": job.seed, "status": "interrupted"}
    row = measure(job, cfg, data, hook)
    row["session_s"] = round(time.perf_counter() - t0, 3)
    atomic_write_text(run_dir / RESULT_JSON, json.dumps(row, indent=1))
    return row


def measure(job: Job, cfg, data, hook: EarlyStats | None) -> dict:
    """Everything ``result.json`` holds, read from the finished run folder."""
    run_dir = Path(job.run_dir)
    model = qkv.load(run_dir).model.eval()
    rows = read_metrics(run_dir / "metrics.jsonl")
    evals = [r for r in rows if "eval_loss" in r]
    final = evals[-1] if evals else {}
    speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    out = {
        "variant": job.variant, "seed": job.seed, "status": "ok",
        "params": sum(p.numel() for p in model.parameters()),
        "steps": cfg.steps, "batch_size": cfg.batch_size * cfg.grad_accum, "max_len": cfg.max_len,
        "lr": cfg.lr, "tokens_seen": cfg.steps * cfg.batch_size * cfg.grad_accum * cfg.max_len,
        "eval_loss": final.get("eval_loss"), "accuracy": final.get("accuracy"),
        "perplexity": final.get("perplexity"), "most_frequent_accuracy": final.get("most_frequent_accuracy"),
        "masked_tokens": final.get("masked_tokens"),
        "tokens_per_s": statistics.median(speeds) if speeds else None,
        "curve": [[r["step"], r["eval_loss"], r["accuracy"]] for r in evals],
    }
    meta = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    if meta.get(REUSED_KEY):
        out[REUSED_KEY] = meta[REUSED_KEY]
    if job.stats:
        ids, mask = _probe(data.eval)
        attentions = encoder_attentions(model, ids, mask)
        summary = attention_summary(attentions, mask)
        if "self_attention_share" in job.stats:
            out.update({k: summary[k] for k in ("self_share", "self_top1", "chance", "self_share_by_layer")})
        if "saturation" in job.stats:
            out.update(max_weight_final=summary["max_weight"], entropy_final=summary["entropy"])
            if hook is not None:
                out.update(hook.summary())
        if "heads" in job.stats:
            special = data.tokenizer.special
            out.update(head_summary(attentions, ids, mask, cls_id=special.cls, sep_id=special.sep))
    if job.length_factor:
        out.update(_long_eval(model, cfg, data, job.length_factor))
    return out


def _long_eval(model, cfg, data, factor: int) -> dict:
    """Held-out loss and accuracy on blocks ``factor × max_len`` long, or why not."""
    length = factor * cfg.max_len
    window = model.config.max_len
    out = {"long_len": length, "long_eval_loss": None, "long_accuracy": None, "long_note": ""}
    if window < length:
        out["long_note"] = f"skipped: the model takes at most {window} tokens"
        return out
    blocks = PackedBlocks(data.eval_cache, length, data.tokenizer.special)
    masking = MaskingConfig(cfg.select_rate, cfg.mask_rate, cfg.random_rate, cfg.whole_word)
    batches = MLMBatches(blocks, cfg.eval_batch_size, data.tokenizer.vocab_size, masking=masking, seed=1234,
                         shuffle=False)
    ev = evaluate(model, batches, device=next(model.parameters()).device, max_batches=cfg.eval_batches)
    out.update(long_eval_loss=ev["eval_loss"], long_accuracy=ev["accuracy"])
    if model.config.positions.scheme == "learned":
        out["long_note"] = f"learned rows ≥ {cfg.max_len} never trained"
    return out


def _watch_parent() -> None:
    """Stop this process (SIGTERM: checkpoint, then exit) when its parent dies."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=watch, daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qkv.experiments.worker", description=__doc__)
    parser.add_argument("job", help="a JSON file holding one Job")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args(argv)
    _watch_parent()
    if args.threads:
        torch.set_num_threads(args.threads)
    job = Job.from_dict(json.loads(Path(args.job).read_text(encoding="utf-8")))
    row = run_job(job, log=lambda msg: print(msg, flush=True))
    print(json.dumps({k: v for k, v in row.items() if k not in ("curve", "self_share_by_layer")}), flush=True)
    return 130 if row["status"] == "interrupted" else 0


if __name__ == "__main__":
    sys.exit(main())
