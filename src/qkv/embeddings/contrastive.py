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

Texts are cut to their first ``max_len`` tokens during training (training sees windows; embedding
later still covers whole documents). The result is a model folder with ``embedding.json`` (the
pooling it was trained for and the training record), which :func:`qkv.embed` reads: by default
(``folder_format="sentence-transformers"``) a sentence-transformers folder
(:func:`qkv.embeddings.st_folder.save_st_folder`: Hugging Face BERT weights, ``modules.json``,
``1_Pooling``, ``2_Normalize``) that ``sentence_transformers.SentenceTransformer`` loads too, with
the same vectors for texts within the window; with ``"qkv"`` a qkv encoder folder.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from qkv._fs import write_folder
from qkv.data.tokenizer_facade import TokenizerView, no_tokenizer
from qkv.data.windows import make_windows, pad_batch
from qkv.embeddings.embedder import EMBED_SPECIALS, EMBEDDING_JSON, folder_defaults
from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.pooling import check_pooling, forward_pooled, normalize_layers
from qkv.errors import check_device
from qkv.validation import check_choice, check_int, check_range

__all__ = ["ContrastiveConfig", "ContrastiveResult", "MODES", "FOLDER_FORMATS", "contrastive_loss",
           "train_embeddings"]

MODES = ("simcse", "supervised")
#: The output folder formats of :func:`train_embeddings`.
FOLDER_FORMATS = ("sentence-transformers", "qkv")


@dataclass(frozen=True)
class ContrastiveConfig:
    """Options of :func:`train_embeddings` (validated on construction)."""

    mode: str = "simcse"
    temperature: float = 0.05
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-5
    weight_decay: float = 0.01
    warmup: float = 0.1  # fraction of the steps
    max_len: int = 128  # training window (tokens incl. [CLS]/[SEP])
    pooling: str = "mean"
    layers: tuple[int, ...] = (-1,)
    dropout: float | None = None  # None: the model's own (BERT: 0.1)
    seed: int = 0
    log_every: int = 10

    def __post_init__(self):
        check_choice("mode", self.mode, MODES, error=EmbeddingError)
        object.__setattr__(self, "pooling", check_pooling(self.pooling))  # "+"-joined form
        for name in ("steps", "batch_size", "log_every"):
            check_int(name, getattr(self, name), low=1, allow_bool=True, error=EmbeddingError)
        if self.batch_size < 2:
            raise EmbeddingError("batch_size must be ≥ 2: in-batch negatives need another document")
        if not self.temperature > 0 or not self.lr > 0:
            raise EmbeddingError(f"temperature ({self.temperature}) and lr ({self.lr}) must be > 0")
        check_range("warmup", self.warmup, 0, 1, noun="a fraction", error=EmbeddingError)
        check_range("dropout", self.dropout, 0, 1, optional=True, error=EmbeddingError)
        if self.mode == "simcse" and self.dropout == 0:
            raise EmbeddingError("SimCSE needs dropout > 0: the two views of a text differ only by dropout")


@dataclass
class ContrastiveResult:
    """What :func:`train_embeddings` did: the folder, the loss curve, and the loss of one fixed
    batch (same dropout seed) before and after training."""

    out: Path
    losses: list[float] = field(default_factory=list)
    initial_loss: float = float("nan")
    final_loss: float = float("nan")
    seconds: float = 0.0


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


def _batch_rows(cfg: ContrastiveConfig, rng: np.random.Generator, n: int,
                by_label: list[np.ndarray] | None, label_of: np.ndarray | None):
    """Indices of one batch: ``(anchors, positives)``."""
    anchors = rng.choice(n, size=min(cfg.batch_size, n), replace=False)
    if cfg.mode == "simcse":
        return anchors, anchors
    positives = np.empty_like(anchors)
    for i, a in enumerate(anchors):
        group = by_label[label_of[a]]
        if len(group) == 1:
            positives[i] = a
            continue
        j = a
        while j == a:
            j = group[rng.integers(len(group))]
        positives[i] = j
    return anchors, positives


def _step_loss(encoder, ids: list[np.ndarray], rows, cfg, pad_id, device, label_of):
    anchors, positives = rows
    windows = [ids[i] for i in anchors] + [ids[i] for i in positives]
    tok, mask = pad_batch(windows, pad_id)  # (2B,T)
    z = forward_pooled(encoder, torch.from_numpy(tok).to(device), torch.from_numpy(mask).to(device),
                       cfg.pooling, cfg.layers)  # (2B,C)
    za, zp = z[:len(anchors)], z[len(anchors):]  # (B,C) each
    labels = None
    if cfg.mode == "supervised":
        labels = torch.from_numpy(label_of[anchors]).to(device)
    return contrastive_loss(za, zp, cfg.temperature, labels)


def train_embeddings(model_path: str | os.PathLike, texts: list[str], out: str | os.PathLike,
                     cfg: ContrastiveConfig, *, labels: list | None = None, device=None,
                     progress: bool = False, source: str = "",
                     folder_format: str = "sentence-transformers") -> ContrastiveResult:
    """Train an encoder for document embeddings and write it to ``out`` (atomically).

    Args:
        model_path: a qkv folder or run, or a Hugging Face BERT folder (with its tokenizer).
        texts: training documents (each cut to ``cfg.max_len`` tokens).
        out: the model folder to write (must not exist, or be empty).
        cfg: the options.
        labels: one label per text (required for ``supervised``).
        device: default CUDA when available.
        progress: a progress bar.
        source: a description of the training data for the record.
        folder_format: ``"sentence-transformers"`` (a folder both qkv and sentence-transformers
            load; needs a model BERT expresses and the last layer only: checked before training) or
            ``"qkv"`` (see the module docstring).

    Raises:
        EmbeddingError: bad options, no labels for supervised training, an unusable model folder,
            a model or layers the sentence-transformers format cannot hold.
    """
    from qkv.models.errors import CheckpointError
    from qkv.models.io import load
    from qkv.models.mlm import MaskedLM
    from qkv.training.optim import build_optimizer, build_scheduler

    check_choice("folder_format", folder_format, FOLDER_FORMATS, error=EmbeddingError)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise EmbeddingError(f"{out} exists and is not an empty folder; choose another output folder")
    if len(texts) < 2:
        raise EmbeddingError(f"need at least 2 training documents, got {len(texts)}")
    label_of = by_label = None
    if cfg.mode == "supervised":
        if labels is None or any(lab is None for lab in labels) or len(labels) != len(texts):
            raise EmbeddingError("supervised training needs a label for every document (a labelled dataset "
                                 "such as dataset:reuters8:train, or JSONL with --label-field)")
        names = sorted(set(map(str, labels)))
        if len(names) < 2:
            raise EmbeddingError("supervised training needs at least two distinct labels (negatives)")
        label_of = np.asarray([names.index(str(lab)) for lab in labels], dtype=np.int64)
        by_label = [np.flatnonzero(label_of == k) for k in range(len(names))]
    declared = folder_defaults(model_path) if Path(model_path).is_dir() else {}  # refusals before training
    overrides = {"attention_dropout": 0.0}
    if cfg.dropout is not None:
        overrides["dropout"] = cfg.dropout
    try:
        model, tokenizer = load(model_path, **overrides)
    except CheckpointError as e:
        raise EmbeddingError(f"cannot load the model: {e}") from e
    if tokenizer is None:
        raise no_tokenizer(f"model folder {model_path}", error=EmbeddingError)
    encoder = model.encoder if isinstance(model, MaskedLM) else model
    if cfg.mode == "simcse" and encoder.config.dropout == 0:
        raise EmbeddingError("the model has dropout 0; SimCSE needs dropout (pass --dropout 0.1)")
    layers = normalize_layers(cfg.layers, len(encoder.layers))
    cfg = ContrastiveConfig(**{**asdict(cfg), "layers": layers})
    if folder_format == "sentence-transformers":
        _check_st_expressible(encoder, layers)
    window = min(cfg.max_len, encoder.max_len)
    tok = TokenizerView(tokenizer, error=EmbeddingError, purpose=EMBED_SPECIALS)
    ids = make_windows(tok.encode(texts), window=window, truncate=True, cls_id=tok.cls_id,
                       sep_id=tok.sep_id).ids  # each text's first window
    check_device(device)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    encoder.to(device).train()
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    fixed = _batch_rows(cfg, np.random.default_rng(cfg.seed + 1), len(ids), by_label, label_of)

    def fixed_loss() -> float:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(cfg.seed + 7)  # same dropout masks before and after training
            with torch.no_grad():
                return float(_step_loss(encoder, ids, fixed, cfg, tok.pad_id, device, label_of))

    result = ContrastiveResult(out=out)
    result.initial_loss = fixed_loss()
    optimizer = build_optimizer(encoder, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = build_scheduler(optimizer, warmup_steps=int(cfg.warmup * cfg.steps), total_steps=cfg.steps,
                                schedule="linear")
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, desc=f"train-embeddings ({cfg.mode})", unit="step", dynamic_ncols=True)
    start = time.perf_counter()
    for step in range(cfg.steps):
        loss = _step_loss(encoder, ids, _batch_rows(cfg, rng, len(ids), by_label, label_of), cfg,
                          tok.pad_id, device, label_of)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(encoder.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        result.losses.append(float(loss.detach()))
        if bar is not None:
            bar.update(1)
            if step % cfg.log_every == 0 or step == cfg.steps - 1:
                bar.set_postfix(loss=f"{np.mean(result.losses[-cfg.log_every:]):.4f}")
    if bar is not None:
        bar.close()
    result.seconds = time.perf_counter() - start
    result.final_loss = fixed_loss()
    encoder.eval().to("cpu")
    record = {"pooling": cfg.pooling, "layers": list(layers), "max_len": declared.get("max_len"),
              "normalize": True,
              "training": {"objective": cfg.mode, "config": {**asdict(cfg), "layers": list(layers)},
                           "source_model": str(Path(model_path).resolve()), "data": source,
                           "documents": len(texts), "initial_loss": result.initial_loss,
                           "final_loss": result.final_loss, "seconds": round(result.seconds, 1),
                           "loss_curve": [round(x, 5) for x in result.losses]}}
    _write_model(encoder, tokenizer, out, record, folder_format)
    return result


def _check_st_expressible(encoder, layers: tuple[int, ...]) -> None:
    """Fail before training when the sentence-transformers format cannot hold the result."""
    from qkv.models import families
    from qkv.models.errors import CheckpointError

    hint = "; pass --format qkv (folder_format='qkv') for a qkv folder"
    if layers != (len(encoder.layers),):
        raise EmbeddingError(f"layers={list(layers)}: a sentence-transformers folder pools the last layer "
                             f"only{hint}")
    try:
        families.for_export(encoder.config).config_to_hf(encoder.config, "encoder")
    except CheckpointError as e:
        raise EmbeddingError(f"a sentence-transformers folder holds a Hugging Face model: {e}{hint}") from e


def _write_model(encoder, tokenizer, out: Path, record: dict, folder_format: str) -> None:
    from qkv.embeddings.options import EmbedOptions
    from qkv.embeddings.st_folder import save_st_folder
    from qkv.models.io import save

    if folder_format == "sentence-transformers":
        options = EmbedOptions(pooling=record["pooling"], layers=tuple(record["layers"]), normalize=True,
                               max_len=record["max_len"]).resolved(n_layers=len(encoder.layers),
                                                                   max_positions=encoder.max_len)
        with write_folder(out, how="new") as tmp:  # assembled aside; published only when complete
            save_st_folder(encoder, tmp, options, tokenizer=tokenizer, extra={EMBEDDING_JSON: record})
        return
    with write_folder(out, how="new") as tmp:  # an empty folder at out (checked before training) is replaced
        save(encoder, tmp, tokenizer=tokenizer)
        (tmp / EMBEDDING_JSON).write_text(json.dumps(record, indent=2), encoding="utf-8")
