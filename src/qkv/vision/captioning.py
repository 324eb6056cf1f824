"""Image captioning on the training engine: the objective, the run, the held-out report.

Order of work: make the training and held-out canvases (:mod:`qkv.data.canvases`) and the
grammar's tokenizer, check them against the model — each problem one line before anything is
written —, create the run folder, train with :func:`qkv.training.engine.run_training` (steps or a
time budget, bf16, checkpoints, ``--resume``, ``metrics.jsonl``, ``curve.png``), then caption every
held-out canvas greedily and score it (:mod:`qkv.vision.caption_scores`).

Run folder::

    run.json                      configs, data summary, status, the report's summary
    metrics.jsonl, curve.png      training loss; held-out loss and exact match on a fixed sample
    checkpoints/                  see qkv.training.checkpoint
    qkv.json, model.safetensors,  the model and its word-level tokenizer (``qkv.load(run)``,
    tokenizer.json                ``qkv caption RUN picture.png``)
    report.json, report.md        exact match and BLEU against the baselines, attention in cell
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from qkv._fs import atomic_write_text
from qkv.checkpoints.io import save
from qkv.data.canvases import CaptionSet, open_captions
from qkv.data.caption_grammar import EOS, UNK, caption_tokenizer
from qkv.data.errors import ImageDataError
from qkv.data.images import pixel_values
from qkv.models.mlm import IGNORE_INDEX
from qkv.models.vision_builders import build_image_captioner
from qkv.training.distributed import refuse_world
from qkv.translation.metrics import score
from qkv.vision.caption import caption_with_attention
from qkv.vision.caption_config import CaptionTrainConfig, caption_model_config
from qkv.vision.caption_scores import (
    baselines,
    cell_masks,
    cell_rates,
    named_attention,
    report_json,
    report_markdown,
    text_scores,
)
from qkv.vision.run_setup import vision_run

__all__ = ["CaptionBatch", "CaptionObjective", "CaptionResult", "train_captions", "encode_captions", "score_captions"]


@dataclass(frozen=True)
class CaptionBatch:
    """A training batch: ``pixel_values (B,K,R,W)`` and ``labels (B,U)`` (``-100`` after ``[EOS]``)."""

    pixel_values: torch.Tensor
    labels: torch.Tensor


@dataclass
class CaptionResult:
    """A finished or interrupted captioning run (``report`` is ``None`` when interrupted)."""

    out: Path
    steps_done: int
    status: str
    report: dict | None


def encode_captions(tokenizer, captions, max_len: int) -> np.ndarray:
    """Captions → ``(N,U)`` int64 labels: the words' ids, ``[EOS]``, ``-100`` after; ``U ≤ max_len - 1``
    (the decoder's window holds the start token too)."""
    rows = [tokenizer.encode(c).ids + [EOS] for c in captions]
    longest = max(len(r) for r in rows)
    if longest > max_len - 1:
        raise ImageDataError(f"a caption has {longest} tokens with [EOS]; the decoder's window (max_len={max_len}) holds "
                             f"{max_len - 1} after the start token: raise max_len in --model")
    unknown = [c for c, r in zip(captions, rows) if UNK in r]
    if unknown:
        raise ImageDataError(f"caption {unknown[0]!r} has a word outside the grammar's vocabulary")
    out = np.full((len(rows), longest), IGNORE_INDEX, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


class CaptionObjective:
    """Cross-entropy of the next word (teacher forcing) on batch ``i`` of a seeded shuffle per epoch
    (the last partial batch dropped); held out, the loss and greedy exact match on a fixed sample."""

    metric, metric_label, loss_label = "exact_match", "exact match", "loss"  # the curve says "held-out …"

    def __init__(self, train: CaptionSet, held: CaptionSet, tokenizer, *, max_len: int, batch_size: int, seed: int,
                 label_smoothing: float, eval_sample: int, eval_batch_size: int):
        if len(train) < batch_size:
            raise ImageDataError(f"{train.name}: {len(train)} training canvases, fewer than one batch of {batch_size}; "
                                 "lower --batch-size")
        self.train, self.held, self.tokenizer = train, held, tokenizer
        self.labels, self.held_labels = encode_captions(tokenizer, train.captions, max_len), \
            encode_captions(tokenizer, held.captions, max_len)
        self.batch_size, self.seed, self.label_smoothing = batch_size, seed, label_smoothing
        self.eval_batch_size, self.per_epoch = eval_batch_size, len(train) // batch_size
        rng = np.random.default_rng([seed, 0xCA97])
        self.sample = np.sort(rng.permutation(len(held))[:eval_sample])
        self._order: tuple[int, np.ndarray] | None = None

    def _epoch(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.train)))
        return self._order[1]

    def batch(self, index: int) -> CaptionBatch:
        epoch, j = divmod(index, self.per_epoch)
        take = np.sort(self._epoch(epoch)[j * self.batch_size:(j + 1) * self.batch_size])
        return CaptionBatch(pixel_values(self.train.pixels[take]), torch.from_numpy(self.labels[take]))

    def units(self, batch: CaptionBatch) -> torch.Tensor:
        return (batch.labels != IGNORE_INDEX).sum().float()

    def loss(self, model, batch: CaptionBatch) -> torch.Tensor:
        logits = model(batch.pixel_values, labels=batch.labels).logits  # (B,U,V)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch.labels.reshape(-1),  # (B·U,V)
                               ignore_index=IGNORE_INDEX, label_smoothing=self.label_smoothing)

    @torch.no_grad()
    def evaluate(self, model) -> dict:
        was = model.training
        model.eval()
        try:
            loss, tokens, hyps = 0.0, 0, []
            for i in range(0, len(self.sample), self.eval_batch_size):
                take = self.sample[i:i + self.eval_batch_size]
                x, y = pixel_values(self.held.pixels[take]), torch.from_numpy(self.held_labels[take])
                logits = model(x, labels=y).logits.float()  # (B,U,V)
                loss += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                              ignore_index=IGNORE_INDEX, reduction="sum"))
                tokens += int((y != IGNORE_INDEX).sum())
                hyps += caption_with_attention(model, self.tokenizer, x, attention=False).captions
        finally:
            model.train(was)
        refs = [self.held.captions[i] for i in self.sample]
        return {"eval_loss": loss / max(1, tokens), **text_scores(hyps, refs), "eval_canvases": len(refs)}

    def describe(self, ev: dict) -> str:
        return (f"held-out exact match {ev['exact_match']:.4f}, BLEU {ev['bleu']:.2f} ({ev['eval_canvases']} canvases), "
                f"loss {ev['eval_loss']:.4f}")

    def save(self, model, out: Path) -> None:
        save(model, out, tokenizer=self.tokenizer)


def score_captions(model, tokenizer, train: CaptionSet, held: CaptionSet, *, batch_size: int = 250,
                   examples: int = 8) -> dict:
    """Greedy captions of every held-out canvas scored against the baselines, with attention in cell."""
    masks = cell_masks(model.config.image, held.cell)
    hyps, weights, inside, correct = [], [], [], []
    for i in range(0, len(held), batch_size):
        x = pixel_values(held.pixels[i:i + batch_size])
        written = caption_with_attention(model, tokenizer, x, batch_size=batch_size)
        hyps += written.captions
        w, c, ok = named_attention(written, held.items[i:i + batch_size], held.names, masks)
        weights.append(w)
        inside.append(c)
        correct.append(ok)
    refs = list(held.captions)
    cell = cell_rates(torch.cat(weights), np.concatenate(inside), np.concatenate(correct))
    return {"model": text_scores(hyps, refs), "baselines": baselines(train, held), "attention_in_cell": cell,
            "eval_canvases": len(refs), "bleu_signature": score(hyps, refs).bleu_signature,
            "examples": [{"caption": h, "reference": r} for h, r in zip(hyps[:examples], refs[:examples])]}


def _fingerprint(*sets: CaptionSet) -> str:
    h = hashlib.sha256()
    for s in sets:
        h.update(np.ascontiguousarray(s.pixels).tobytes())
        h.update("\n".join(s.captions).encode())
    return h.hexdigest()


def _read_data(cfg: CaptionTrainConfig) -> tuple[CaptionSet, CaptionSet]:
    if not cfg.data.startswith("dataset:") or cfg.data.rstrip(":").lower().endswith(":test"):
        raise ImageDataError(f"--data {cfg.data}: captioning trains on dataset:fashion-captions (its train split; the "
                             "test split is held out)")
    name = cfg.data.split(":")[1]
    return open_captions(f"dataset:{name}:train"), open_captions(f"dataset:{name}:test")


def train_captions(cfg: CaptionTrainConfig, *, data: tuple[CaptionSet, CaptionSet] | None = None, resume: bool = False,
                   clock=time.monotonic, on_backward=None) -> CaptionResult:
    """Train an image captioner as ``cfg`` says (see the module docstring); ``data``: ``(train, held
    out)`` canvases instead of ``cfg.data`` (tests, other canvases)."""
    refuse_world("captioning runs in one process; run it without torchrun")
    cfg = cfg.resolved()
    train, held = data if data is not None else _read_data(cfg)
    if held.size != train.size or held.names != train.names:
        raise ImageDataError(f"held-out canvases ({held.name}) do not match the training canvases ({train.name})")
    tokenizer = caption_tokenizer(train.names)
    config = caption_model_config(cfg.preset, tokenizer.get_vocab_size(), train.size, train.channels, cfg.model)
    summary = {"train_canvases": len(train), "held_out_canvases": len(held), "train": train.name,
               "held_out": held.name, "size": list(train.size), "grid": list(train.grid),
               "held_out_links": len(held.held_out)}
    with vision_run(cfg, kind="caption", what="canvases", model_config=config, summary=summary,
                    fingerprint=lambda: _fingerprint(train, held), resume=resume) as started:
        run = started.run
        if started.report is not None:
            return CaptionResult(run.out, started.steps_done, "complete", started.report)
        model = build_image_captioner(config)
        objective = CaptionObjective(train, held, tokenizer, max_len=config.max_len, batch_size=cfg.batch_size,
                                     seed=cfg.seed, label_smoothing=cfg.label_smoothing, eval_sample=cfg.eval_sample,
                                     eval_batch_size=cfg.eval_batch_size)
        if cfg.progress:
            span = f"{cfg.time_budget:g} min" if cfg.time_budget is not None else f"{cfg.steps} steps"
            print(f"qkv pretrain --objective caption: {len(train)} canvases ({train.name}), held out {len(held)} "
                  f"({held.name}); {config.image.n_tokens} image tokens, vocabulary {config.vocab_size}; {span}, "
                  f"batch {cfg.batch_size}, lr {cfg.lr:g}", flush=True)
        result = started.train(objective, model, title=f"{cfg.preset} on {train.name}", clock=clock,
                               on_backward=on_backward)
        if result.status != "complete":
            return CaptionResult(run.out, result.steps_done, result.status, None)
        report = score_captions(model.eval(), tokenizer, train, held, batch_size=cfg.eval_batch_size)
        report.update(held_out=held.name, train_minutes=round(result.elapsed_s / 60, 2), steps=result.steps_done,
                      precision=started.precision,
                      canvases_per_s=round((result.steps_done - result.start_step) * cfg.batch_size * cfg.grad_accum
                                           / max(result.train_s, 1e-9), 1))
        atomic_write_text(run.out / "report.json", report_json(report))
        atomic_write_text(run.out / "report.md", report_markdown(report))
        run.update(report={"exact_match": report["model"]["exact_match"], "bleu": report["model"]["bleu"],
                           "train_minutes": report["train_minutes"]})
        return CaptionResult(run.out, result.steps_done, "complete", report)
