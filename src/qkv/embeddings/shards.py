"""Embedding a corpus on K processes: ``qkv embed`` and ``qkv index`` under ``torchrun``.

    torchrun --nproc-per-node K -m qkv embed MODEL INPUT --out vectors.npy
    torchrun --nproc-per-node K -m qkv index MODEL CORPUS --out index/

Every process reads the input and embeds the documents whose number n (0, 1, 2, … in input order)
has n mod K = its rank, into its own shard beside the output::

    OUT.shards/shard-00001-of-00004/   vectors.npy · rows.jsonl ({"seq", "id"[, "text"]}) · shard.json

A shard is assembled under a temporary name and renamed into place when it is complete
(:mod:`qkv._fs`), so it is there whole or not at all. ``shard.json`` records what it is of (the
model, the input, the options that decide the vectors, K) and its counts. Rank 0, its own shard
done, waits for the others, merges them by document number into the output — written as one
process writes it, atomically — and removes ``OUT.shards``.

A process that dies leaves no shard of its own (only a temporary folder, removed by the next
attempt). Run the same command again: every shard that is there is kept, the missing ones are
embedded again. Shards of another job (another model, input, options or K) are refused, never mixed
in. Processes do not talk to each other: they meet in the file system (one machine, or a folder all
nodes see), so no process group is needed.
"""

from __future__ import annotations

import heapq
import json
import os
import shutil
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qkv._faults import fault_point
from qkv._fs import write_folder
from qkv.embeddings.embedder import EmbedStats, Embedder
from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.ann import AnnOptions
from qkv.embeddings.options import VECTOR_FIELDS, EmbedOptions, as_options
from qkv.embeddings.search import check_index_out, finish_index, write_documents
from qkv.embeddings.streams import open_writer, output_format

__all__ = ["ShardPlan", "shard_plan", "embed_sharded", "index_sharded", "ShardedResult", "job_record", "write_shard",
           "wait_for_shards", "merged_rows", "merged_stats", "remove_shards", "rank_device", "SHARD_JSON"]

SHARD_JSON = "shard.json"
SHARDS_FORMAT = "qkv-embedding-shard"
_MERGE_CHUNK = 4096  # rows per merged write
_STAT_FIELDS = ("documents", "windows", "tokens", "long_documents", "truncated", "empty")


@dataclass(frozen=True)
class ShardPlan:
    """Where this process's shard goes: ``rank`` of ``world`` processes, for the output ``out``."""

    out: Path
    rank: int
    world: int

    @property
    def root(self) -> Path:
        """The folder of the shards, beside the output."""
        return self.out.parent / f"{self.out.name}.shards"

    def folder(self, rank: int) -> Path:
        return self.root / f"shard-{rank:05d}-of-{self.world:05d}"

    def mine(self, records: Iterable[tuple[Any, str]]) -> Iterator[tuple[int, Any, str]]:
        """``(n, id, text)`` of the documents this rank embeds: n mod world = rank."""
        for n, (rid, text) in enumerate(records):
            if n % self.world == self.rank:
                yield n, rid, text


def shard_plan(out: str | os.PathLike, input_spec: str) -> ShardPlan | None:
    """The plan of a process launched by ``torchrun`` with more than one process (``None`` otherwise).

    Raises:
        EmbeddingError: the input is standard input (it cannot be read by every process).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    if input_spec == "-":
        raise EmbeddingError("standard input cannot be split over torchrun's processes (each would read its own "
                             "copy of it); write it to a file and give the file")
    return ShardPlan(Path(out), int(os.environ.get("RANK", "0")), world)


def rank_device(options: EmbedOptions) -> EmbedOptions:
    """``options`` with the device of this torchrun process: ``cuda:LOCAL_RANK`` where the device is
    CUDA (or unset with a GPU present), else as given."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = options.device
    if dev in (None, "auto") and torch.cuda.is_available():
        dev = "cuda"
    if isinstance(dev, str) and dev == "cuda":
        return options.replace(device=f"cuda:{local}")
    return options


def _stat(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns] if path.is_file() else None


def job_record(kind: str, model: str | os.PathLike, source: str, embedder: Embedder, world: int) -> dict[str, Any]:
    """What a shard is of: ``kind`` (embed or index), the model folder and its weights' size and
    time, the input and (a file) its size and time, the options that decide the vectors, K."""
    model = Path(model).resolve()
    weights = next((model / n for n in ("model.safetensors", "pytorch_model.bin") if (model / n).is_file()), None)
    src = Path(source) if not source.startswith("dataset:") else None
    return {"kind": kind, "model": str(model), "weights": _stat(weights) if weights else None,
            "input": str(src.resolve()) if src is not None else source, "input_stat": _stat(src) if src else None,
            "options": embedder.options.to_dict(VECTOR_FIELDS + ("empty", "precision")), "world_size": world}


def _read_shard_json(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / SHARD_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == SHARDS_FORMAT else None


def _check_job(folder: Path, shard: dict, job: dict) -> None:
    if shard.get("job") != job:
        theirs = shard.get("job") or {}
        diff = sorted(k for k in set(job) | set(theirs) if job.get(k) != theirs.get(k))
        raise EmbeddingError(f"{folder} is a shard of another job ({', '.join(diff)} differ); remove "
                             f"{folder.parent} to start over, or choose another --out")


def write_shard(plan: ShardPlan, embedder: Embedder, records: Iterable[tuple[Any, str]], job: dict, *,
                texts: bool) -> tuple[dict, bool]:
    """Embed this rank's documents into its shard (``texts``: keep each document's text, for an
    index); returns ``(shard.json, kept)`` — ``kept``: a complete shard of this job was there and
    nothing was embedded.

    Raises:
        EmbeddingError: a shard of another job is in the way, or the embedder's errors.
    """
    folder = plan.folder(plan.rank)
    shard = _read_shard_json(folder)
    if shard is not None:
        _check_job(folder, shard, job)
        return shard, True
    pending: deque[tuple[int, Any, str]] = deque()
    ids = {}  # document number → id of the empty documents the embedder names (at most 20)

    def numbered():
        for n, rid, text in plan.mine(records):
            pending.append((n, rid, text))
            if not text.strip() and len(ids) < 20:
                ids[n] = rid
            yield n, text

    with write_folder(folder, how="new") as tmp:
        with open_writer(tmp / "vectors.npy", embedder.dim) as writer, open(tmp / "rows.jsonl", "wb") as fh:
            for seqs, vectors in embedder.embed_stream(numbered()):
                writer.write(seqs, vectors)
                for seq in seqs:
                    while pending[0][0] != seq:  # documents left out (empty, skipped)
                        pending.popleft()
                    _, rid, text = pending.popleft()
                    row = {"seq": seq, "id": rid, **({"text": text} if texts else {})}
                    fh.write(json.dumps(row, ensure_ascii=False).encode() + b"\n")
        st = embedder.stats
        shard = {"format": SHARDS_FORMAT, "job": job, "rank": plan.rank, "rows": writer.rows, "dim": embedder.dim,
                 **{f: getattr(st, f) for f in _STAT_FIELDS},
                 "empty_ids": [[n, ids.get(n, n)] for n in embedder.empty_ids]}
        (tmp / SHARD_JSON).write_text(json.dumps(shard), encoding="utf-8")
        fault_point(f"embed.shard.{plan.rank}")
    return shard, False


def wait_for_shards(plan: ShardPlan, job: dict, *, poll_s: float = 0.2) -> list[dict]:
    """Rank 0: the ``shard.json`` of every shard, once all are complete (every one of this job)."""
    shards: dict[int, dict] = {}
    while len(shards) < plan.world:
        for r in range(plan.world):
            if r not in shards and (shard := _read_shard_json(plan.folder(r))) is not None:
                _check_job(plan.folder(r), shard, job)
                shards[r] = shard
        if len(shards) < plan.world:
            time.sleep(poll_s)
    return [shards[r] for r in range(plan.world)]


def _rows(plan: ShardPlan, rank: int, shard: dict) -> Iterator[tuple[int, int, int, dict, np.memmap]]:
    vectors = np.load(plan.folder(rank) / "vectors.npy", mmap_mode="r")
    if vectors.shape != (shard["rows"], shard["dim"]):
        raise EmbeddingError(f"{plan.folder(rank)}: {vectors.shape} vectors, shard.json says {shard['rows']}; the "
                             f"shard is damaged: remove it and run the command again")
    with open(plan.folder(rank) / "rows.jsonl", "rb") as fh:
        for i, line in enumerate(fh):
            row = json.loads(line)
            yield row["seq"], rank, i, row, vectors


def merged_rows(plan: ShardPlan, shards: list[dict]) -> Iterator[tuple[list, list, np.ndarray]]:
    """``(ids, texts, vectors)`` chunks of all shards in document order (``texts`` empty strings for
    shards of ``qkv embed``)."""
    ids: list = []
    texts: list[str] = []
    rows: list[np.ndarray] = []
    for _, _, i, row, vectors in heapq.merge(*(_rows(plan, r, s) for r, s in enumerate(shards)),
                                             key=lambda t: t[0]):
        ids.append(row["id"])
        texts.append(row.get("text", ""))
        rows.append(np.asarray(vectors[i], dtype=np.float32))
        if len(ids) >= _MERGE_CHUNK:
            yield ids, texts, np.stack(rows)
            ids, texts, rows = [], [], []
    if ids:
        yield ids, texts, np.stack(rows)


def merged_stats(shards: list[dict]) -> tuple[EmbedStats, list]:
    """The counts of all shards together, and the first empty documents' ids."""
    stats = EmbedStats(**{f: sum(int(s.get(f, 0)) for s in shards) for f in _STAT_FIELDS})
    empty = sorted((n, rid) for s in shards for n, rid in s.get("empty_ids", []))  # in input order
    return stats, [rid for _, rid in empty[:20]]


@dataclass
class ShardedResult:
    """What one process of a sharded run did.

    Attributes:
        rank, world: the process and the number of processes.
        kept: its shard was there from an earlier attempt (nothing embedded).
        shard_rows: the documents of its shard.
        rows, dim: the output's (rank 0; ``rows`` is 0 on the other ranks).
        stats, empty_ids: all shards' counts together (rank 0), for the report.
        meta: the ``index.json`` written (``qkv index``, rank 0).
    """

    rank: int
    world: int
    kept: bool
    shard_rows: int
    rows: int = 0
    dim: int = 0
    stats: EmbedStats | None = None
    empty_ids: list | None = None
    meta: dict | None = None


def _embed_shard(plan: ShardPlan, kind: str, model, records, source: str, options: EmbedOptions):
    embedder = Embedder(model, rank_device(options.replace(progress=options.progress and plan.rank == 0)))
    job = job_record(kind, model, source, embedder, plan.world)
    shard, kept = write_shard(plan, embedder, records, job, texts=kind == "index")
    return embedder, job, shard, kept


def embed_sharded(model: str | os.PathLike, records: Iterable[tuple[Any, str]], out: str | os.PathLike, plan: ShardPlan,
                  *, options: EmbedOptions, source: str) -> ShardedResult:
    """``qkv embed`` on this process of ``plan``: its shard, then (rank 0) the output file (``.npy``,
    ``.jsonl`` or ``.parquet``) merged from all shards in input order."""
    output_format(out)
    embedder, job, shard, kept = _embed_shard(plan, "embed", model, records, source, options)
    result = ShardedResult(plan.rank, plan.world, kept, shard["rows"], dim=embedder.dim)
    if plan.rank != 0:
        return result
    shards = wait_for_shards(plan, job)
    with open_writer(out, embedder.dim) as writer:
        for ids, _, vectors in merged_rows(plan, shards):
            writer.write(ids, vectors)
    remove_shards(plan)
    result.rows = writer.rows
    result.stats, result.empty_ids = merged_stats(shards)
    return result


def index_sharded(model: str | os.PathLike, records: Iterable[tuple[Any, str]], out: str | os.PathLike,
                  plan: ShardPlan, *, options: EmbedOptions | None = None, ann: AnnOptions | None = None,
                  source: str = "") -> ShardedResult:
    """``qkv index`` on this process of ``plan``: its shard, then (rank 0) the index folder — the
    same files as one process writes, the approximate index built over all vectors."""
    options = as_options(options, default=EmbedOptions(empty="skip")).replace(normalize=True)
    out = check_index_out(model, out)
    embedder, job, shard, kept = _embed_shard(plan, "index", model, records, source, options)
    result = ShardedResult(plan.rank, plan.world, kept, shard["rows"], dim=embedder.dim)
    if plan.rank != 0:
        return result
    shards = wait_for_shards(plan, job)
    stats, empty_ids = merged_stats(shards)
    with write_folder(out, how="new") as tmp:
        rows = write_documents(tmp, embedder.dim, merged_rows(plan, shards))
        summary = {"empty_skipped": stats.empty, "long_documents": stats.long_documents, "truncated": stats.truncated}
        meta = finish_index(tmp, model=model, embedding=embedder.options.to_dict(VECTOR_FIELDS), count=rows,
                            dim=embedder.dim, source=source, stats=summary, ann=ann or AnnOptions())
    remove_shards(plan)
    result.rows, result.stats, result.empty_ids, result.meta = rows, stats, empty_ids, meta
    return result


def remove_shards(plan: ShardPlan) -> None:
    """Remove the shards folder (qkv's own work files) once the output is in place."""
    shutil.rmtree(plan.root, ignore_errors=True)

