"""Contrastive training of document embeddings: unsupervised SimCSE and supervised (same label).

Legend: B documents in a batch, T padded length, C model width.

Both objectives score a batch of B anchors against B positives by cosine similarity divided by a
temperature τ and take the cross-entropy of picking each anchor's own positive among the B
(in-batch negatives):

* ``simcse`` (Gao et al. 2021, unsupervised): the positive is the same text passed through the
  encoder a second time — only the dropout masks differ. Both copies go through one forward pass of
  2B rows.
* ``supervised``: the positive is another document with the anchor's label (the anchor itself when
  its label has no other document). Other batch members with the anchor's label are positives too,
  so they are removed from its negatives (their logits are masked out), never pushed away.

Training is the :class:`ContrastiveObjective` on the training engine
(:func:`qkv.training.engine.run_training`): by steps or a time budget, fp32 or bf16, with a run
folder (:mod:`qkv.training.lifecycle`: ``run.json``, ``metrics.jsonl``, ``curve.png``, checkpoints)
that ``resume=True`` continues bit for bit — batch ``i`` draws its documents from a generator seeded
by ``(seed, i)``. In-batch negatives are those of one process: under ``torchrun`` (more than one
process) training is refused rather than run with fewer negatives per rank.

Texts are cut to their first ``max_len`` tokens during training (training sees windows; embedding
later still covers whole documents). The run folder ends as a model folder with
``embedding.json`` (the pooling it was trained for and the training record, written last), which
:func:`qkv.embed` reads: by default (``folder_format="sentence-transformers"``) a
sentence-transformers folder (:func:`qkv.checkpoints.st_folder.save_st_folder`: Hugging Face BERT
weights, ``modules.json``, ``1_Pooling``, ``2_Normalize``) that
``sentence_transformers.SentenceTransformer`` loads too, with the same vectors for texts within the
window; with ``"qkv"`` a qkv encoder folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from qkv._fs import atomic_write_text, write_folder
from qkv.data.tokenizer_facade import TokenizerView, no_tokenizer
from qkv.data.windows import make_windows, pad_batch
from qkv.embeddings.contrastive_config import ContrastiveConfig
from qkv.embeddings.embedder import EMBEDDING_JSON, folder_defaults
from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.options import EmbedOptions
from qkv.embeddings.pooling import forward_pooled, normalize_layers
from qkv.checkpoints.st_folder import save_st_folder
from qkv.checkpoints.st_settings import MODULES_JSON
from qkv.errors import check_device
from qkv.checkpoints import families
from qkv.errors import CheckpointError
from qkv.checkpoints.io import load, save
from qkv.models.mlm import MaskedLM
from qkv.nn.encoder import Encoder
from qkv.training import distributed as qdist
from qkv.training.config import LoopConfig
from qkv.training.engine import run_training
from qkv.training.lifecycle import RunFolder, open_run, resume_eval
from qkv.training.metrics import read_metrics
from qkv.training.precision import resolve_precision
from qkv.validation import check_choice

__all__ = ["ContrastiveResult", "ContrastiveObjective", "FOLDER_FORMATS", "contrastive_loss", "train_embeddings"]

#: The output folder formats of :func:`train_embeddings`.
FOLDER_FORMATS = ("sentence-transformers", "qkv")


@dataclass
class ContrastiveResult:
    """What :func:`train_embeddings` did: the folder, the loss every ``log_every`` steps, and the loss
    of one fixed batch (same dropout seed) before and after training; ``status`` ``complete`` or
    ``interrupted`` (a stop request: ``resume=True`` continues; no model folder yet)."""

    out: Path
    losses: list[float] = field(default_factory=list)
    initial_loss: float = float("nan")
    final_loss: float = float("nan")
    seconds: float = 0.0
    status: str = "complete"
    steps_done: int = 0


def contrastive_loss(anchors: torch.Tensor, positives: torch.Tensor, temperature: float,
                     labels: torch.Tensor | None = None) -> torch.Tensor:
    """In-batch contrastive cross-entropy.

    Args:
        anchors, positives: ``(B,C)``; row i of each is a positive pair.
        temperature: τ.
        labels: ``(B,)`` (supervised): off-diagonal pairs with equal labels are excluded from the
            negatives.

    Returns:
        Scalar mean loss.
    """
    a = F.normalize(anchors, dim=-1)
    p = F.normalize(positives, dim=-1)
    logits = a @ p.T / temperature  # (B,C)(C,B) -> (B,B)
    target = torch.arange(len(a), device=a.device)
    if labels is not None:
        same = labels[:, None] == labels[None, :]  # (B,B)
        same.fill_diagonal_(False)
        logits = logits.masked_fill(same, float("-inf"))
    return F.cross_entropy(logits, target)


@dataclass(frozen=True)
class PairBatch:
    """``input_ids``/``attention_mask`` ``(2B,T)``: B anchors, then their B positives; ``labels``
    ``(B,)`` (supervised) or ``None``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor | None


class ContrastiveObjective:
    """In-batch contrastive cross-entropy of B anchors against their positives; held out, the loss
    of one fixed batch under fixed dropout masks (``fixed_loss``: the same before and after).

    Args:
        ids: each document's training window (token ids). cfg: the options.
        pad_id: the padding id. label_of: ``(N,)`` label index of each document (supervised).
        write: ``f(model, out)`` writes the trained model into the run folder (its ``save``).
    """

    metric, metric_label, loss_label = "fixed_loss", "loss of a fixed batch", "contrastive loss"

    def __init__(self, ids: list[np.ndarray], cfg: ContrastiveConfig, pad_id: int, label_of: np.ndarray | None,
                 write: Callable[[torch.nn.Module, Path], None] | None = None):
        self.ids, self.cfg, self.pad_id, self.label_of, self.write = ids, cfg, pad_id, label_of, write
        self.by_label = None if label_of is None else [np.flatnonzero(label_of == k)
                                                       for k in range(int(label_of.max()) + 1)]
        self.fixed = self._pairs(np.random.default_rng(cfg.seed + 1))

    def _pairs(self, rng: np.random.Generator) -> PairBatch:
        anchors = rng.choice(len(self.ids), size=min(self.cfg.batch_size, len(self.ids)), replace=False)
        positives = anchors
        if self.cfg.mode == "supervised":
            positives = np.empty_like(anchors)
            for i, a in enumerate(anchors):
                group = self.by_label[self.label_of[a]]
                j = a
                while j == a and len(group) > 1:
                    j = group[rng.integers(len(group))]
                positives[i] = j
        tok, mask = pad_batch([self.ids[i] for i in anchors] + [self.ids[i] for i in positives], self.pad_id)
        labels = None if self.label_of is None else torch.from_numpy(self.label_of[anchors])
        return PairBatch(torch.from_numpy(tok), torch.from_numpy(mask), labels)  # (2B,T), (2B,T), (B,)

    def batch(self, index: int) -> PairBatch:
        return self._pairs(np.random.default_rng([self.cfg.seed, index]))

    def loss(self, model, batch: PairBatch) -> torch.Tensor:
        z = forward_pooled(model, batch.input_ids, batch.attention_mask, self.cfg.pooling, self.cfg.layers)  # (2B,C)
        n = len(z) // 2
        labels = batch.labels.to(z.device) if batch.labels is not None else None
        return contrastive_loss(z[:n], z[n:], self.cfg.temperature, labels)  # anchors (B,C) vs positives (B,C)

    def evaluate(self, model) -> dict:
        device = next(model.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(self.cfg.seed + 7)  # the same dropout masks before and after training
            with torch.no_grad():
                b = self.fixed
                loss = self.loss(model, PairBatch(b.input_ids.to(device), b.attention_mask.to(device), b.labels))
        return {"fixed_loss": float(loss)}

    def describe(self, ev: dict) -> str:
        return f"loss of the fixed batch {ev['fixed_loss']:.4f}"

    def save(self, model, out: Path) -> None:
        if self.write is not None:
            self.write(model, Path(out))


def train_embeddings(model_path: str | os.PathLike, texts: list[str], out: str | os.PathLike,
                     cfg: ContrastiveConfig, *, labels: list | None = None, device=None,
                     progress: bool = False, source: str = "", folder_format: str = "sentence-transformers",
                     resume: bool = False, clock: Callable[[], float] = time.monotonic,
                     on_backward=None) -> ContrastiveResult:
    """Train an encoder for document embeddings in the run folder ``out``, which ends as its model
    folder (see the module docstring).

    Args:
        model_path: a qkv folder or run, or a Hugging Face BERT folder (with its tokenizer).
        texts: training documents (each cut to ``cfg.max_len`` tokens).
        out: the run folder: missing or empty (or, with ``resume``, holding this run).
        cfg: the options.
        labels: one label per text (required for ``supervised``).
        device: default CUDA when available.
        progress: a progress bar.
        source: a description of the training data for the record.
        folder_format: ``"sentence-transformers"`` (a folder both qkv and sentence-transformers
            load; needs a model BERT expresses and the last layer only: checked before training) or
            ``"qkv"`` (see the module docstring).
        resume: continue the run in ``out`` from its last checkpoint (same model, texts, labels and
            options; a finished run is returned as it is).
        clock: the monotonic time source of a time budget (tests pass a fake one).
        on_backward: ``f(step, model)`` after each backward pass (:func:`~qkv.training.engine.run_training`).

    Raises:
        EmbeddingError: bad options, no labels for supervised training, an unusable model folder,
            a model or layers the sentence-transformers format cannot hold, ``out`` not free (or not
            this run, with ``resume``), more than one process.
    """
    check_choice("folder_format", folder_format, FOLDER_FORMATS, error=EmbeddingError)
    qdist.refuse_world("train-embeddings runs in one process: its in-batch negatives are not gathered across "
                       "ranks; run it without torchrun", EmbeddingError)
    if len(texts) < 2:
        raise EmbeddingError(f"need at least 2 training documents, got {len(texts)}")
    label_of = _label_index(cfg, texts, labels)
    with open_run(out, resume=resume, error=EmbeddingError) as run:
        if resume and (meta := run.finished(cfg, files=(EMBEDDING_JSON,))) is not None:
            return _finished(run.out, meta)
        given = cfg  # stored and compared as given (its layers resolved below, once the model is known)
        encoder, tokenizer, cfg, declared = _load_encoder(model_path, cfg, folder_format)
        tok = TokenizerView(tokenizer, error=EmbeddingError)
        window = min(cfg.max_len, encoder.max_len)
        ids = make_windows(tok.encode(texts), window=window, truncate=True, prefix=tok.prefix,
                           suffix=tok.suffix).ids  # each text's first window
        check_device(device)
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        record = {"kind": "contrastive", "train_config": given.to_dict(), "model_config": encoder.config.to_dict(),
                  "folder_format": folder_format, "data_sha256": _fingerprint(texts, labels),
                  "source_model": str(Path(model_path).resolve()), "data": source, "documents": len(texts),
                  "max_len": declared.get("max_len")}
        write = lambda model, dest: _write_model(model, tokenizer, dest, record["max_len"], cfg, folder_format)  # noqa: E731
        objective = ContrastiveObjective(ids, cfg, tok.pad_id, label_of, write)
        encoder.to(device).train()
        record["initial_loss"] = objective.evaluate(encoder)["fixed_loss"]
        _start(run, given, record)
        return _train(run, cfg, encoder, objective, device, record, progress, clock, on_backward)


def _label_index(cfg: ContrastiveConfig, texts: list[str], labels) -> np.ndarray | None:
    """Each document's label index (supervised), checked; ``None`` for SimCSE."""
    if cfg.mode != "supervised":
        return None
    if labels is None or any(lab is None for lab in labels) or len(labels) != len(texts):
        raise EmbeddingError("supervised training needs a label for every document (a labelled dataset "
                             "such as dataset:reuters8:train, or JSONL with --label-field)")
    names = sorted(set(map(str, labels)))
    if len(names) < 2:
        raise EmbeddingError("supervised training needs at least two distinct labels (negatives)")
    return np.asarray([names.index(str(lab)) for lab in labels], dtype=np.int64)


def _load_encoder(model_path, cfg: ContrastiveConfig, folder_format: str):
    """``(encoder, tokenizer, cfg with its layers resolved, the folder's declared settings)``;
    every refusal before training."""
    declared = folder_defaults(model_path) if Path(model_path).is_dir() else {}
    overrides = {"attention_dropout": 0.0}
    if cfg.dropout is not None:
        overrides["dropout"] = cfg.dropout
    try:
        model, tokenizer = load(model_path, **overrides)
    except CheckpointError as e:
        raise EmbeddingError(f"cannot load the model: {e}") from e
    encoder = model.encoder if isinstance(model, MaskedLM) else model
    if not isinstance(encoder, Encoder):  # the kind first: a tokenizer would not make an image model a text encoder
        raise EmbeddingError(f"{model_path}: a model of type {type(model).__name__} is not a text encoder; train-embeddings trains "
                             "an encoder or masked-LM folder (BERT, RoBERTa, DistilBERT, ModernBERT, ELECTRA, a qkv "
                             "masked LM)")
    if tokenizer is None:
        raise no_tokenizer(f"model folder {model_path}", error=EmbeddingError)
    if cfg.mode == "simcse" and encoder.config.dropout == 0:
        raise EmbeddingError("the model has dropout 0; SimCSE needs dropout (pass --dropout 0.1)")
    layers = normalize_layers(cfg.layers, len(encoder.layers))
    cfg = cfg.replace(layers=layers)
    if folder_format == "sentence-transformers":
        _check_st_expressible(encoder, layers)
    return encoder, tokenizer, cfg, declared


def _fingerprint(texts: list[str], labels) -> str:
    h = hashlib.sha256(b"qkv-contrastive-data:v1\0")
    for i, text in enumerate(texts):
        h.update(json.dumps([text, None if labels is None else str(labels[i])], ensure_ascii=False).encode() + b"\0")
    return h.hexdigest()


def _start(run: RunFolder, cfg: ContrastiveConfig, record: dict) -> None:
    """Create the run folder, or check that a resumed one is this run (options, data, model, format)."""
    if not run.resume:
        run.create(record)
        return
    run.check_config(cfg)
    meta = run.meta()
    for key, what in (("data_sha256", "the texts or labels"), ("model_config", "the starting model"),
                      ("folder_format", "--format")):
        if meta.get(key) != record[key]:
            raise EmbeddingError(f"--resume: {what} differ from those {run.out} was started with; resume with "
                                 "the same, or start a new run with another --out")


def _train(run: RunFolder, cfg: ContrastiveConfig, encoder, objective, device, record, progress, clock,
           on_backward) -> ContrastiveResult:
    precision, note = resolve_precision(cfg.precision, device)
    if note and progress:
        print(f"qkv train-embeddings: {note}", flush=True)
    loop = LoopConfig(steps=cfg.steps if cfg.time_budget is None else None, time_budget=cfg.time_budget, lr=cfg.lr,
                      weight_decay=cfg.weight_decay, warmup_steps=int(cfg.warmup * cfg.steps), clip_norm=1.0,
                      seed=cfg.seed, save_every=max(1, cfg.steps // 10), log_every=cfg.log_every, progress=progress)
    info = qdist.DistInfo(0, 1, 0, device)
    r = run_training(loop, objective, model=encoder, run=run, info=info, precision=precision,
                     title=f"train-embeddings ({cfg.mode})", clock=clock, resume_eval=resume_eval,
                     on_backward=on_backward)
    encoder.eval()
    losses = [row["loss"] for row in r.history if "loss" in row]
    result = ContrastiveResult(run.out, losses, record["initial_loss"], (r.final_eval or {}).get("fixed_loss",
                               float("nan")), r.train_s, r.status, r.steps_done)
    if r.status == "complete":
        training = {"objective": cfg.mode, "config": cfg.to_dict(), "source_model": record["source_model"],
                    "data": record["data"], "documents": record["documents"], "initial_loss": result.initial_loss,
                    "final_loss": result.final_loss, "seconds": round(r.elapsed_s, 1), "precision": precision,
                    "steps": r.steps_done, "loss_curve": [round(x, 5) for x in losses]}
        embedding = {"pooling": cfg.pooling, "layers": list(cfg.layers), "max_len": record["max_len"],
                     "normalize": True, "training": training}
        atomic_write_text(run.out / EMBEDDING_JSON, json.dumps(embedding, indent=2))  # last: the run is done
    return result


def _finished(out: Path, meta: dict) -> ContrastiveResult:
    """The result of a run that is complete (``resume`` of it changes nothing)."""
    losses = [row["loss"] for row in read_metrics(out / "metrics.jsonl") if "loss" in row]
    return ContrastiveResult(out, losses, meta["initial_loss"], meta["final_eval"]["fixed_loss"], 0.0, "complete",
                             int(meta.get("steps_done", 0)))


def _check_st_expressible(encoder, layers: tuple[int, ...]) -> None:
    """Fail before training when the sentence-transformers format cannot hold the result."""
    hint = "; pass --format qkv (folder_format='qkv') for a qkv folder"
    if layers != (len(encoder.layers),):
        raise EmbeddingError(f"layers={list(layers)}: a sentence-transformers folder pools the last layer "
                             f"only{hint}")
    try:
        families.for_export(encoder.config).config_to_hf(encoder.config, "encoder")
    except CheckpointError as e:
        raise EmbeddingError(f"a sentence-transformers folder holds a Hugging Face model: {e}{hint}") from e


def _write_model(encoder, tokenizer, out: Path, max_len: int | None, cfg: ContrastiveConfig,
                 folder_format: str) -> None:
    """The trained encoder into the run folder ``out`` (its other files kept); ``embedding.json``
    follows once the run is complete."""
    encoder = encoder.to("cpu")
    if folder_format == "qkv":
        save(encoder, out, tokenizer=tokenizer)  # merged into the run folder, qkv.json last
        return
    if (out / MODULES_JSON).is_file():  # published by an earlier finalisation (modules.json goes last)
        return
    options = EmbedOptions(pooling=cfg.pooling, layers=tuple(cfg.layers), normalize=True, max_len=max_len).resolved(
        n_layers=len(encoder.layers), max_positions=encoder.max_len)
    with write_folder(out, how="merge", last=MODULES_JSON) as tmp:  # assembled aside, then moved in
        save_st_folder(encoder, tmp, options, tokenizer=tokenizer)
