"""Vectors out — streamed, so that a million-line input never sits in memory.

Documents come in through :func:`qkv.data.readers.read_records` (text, JSONL, ``.gz``, standard
input) or :mod:`qkv.data.corpus` (folders, named datasets); this module writes the vectors.

Outputs (:func:`open_writer`, format from the suffix): ``.npy`` (float32 ``(N,C)``, rows in input
order; the header is rewritten with the final N at the end), ``.jsonl`` (``{"id": …, "vector":
[…]}`` per line, floats printed with 9 significant digits — exact for float32) and ``.parquet``
(columns ``id`` (string) and ``vector`` (fixed-size list of float32); needs ``pyarrow``). Every
writer writes to a temporary file beside the target and renames it into place only when all rows
are written; on failure the temporary file is removed, so no partial output is ever left.
"""

from __future__ import annotations

import io
import json
import os
import struct
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from qkv._disk import disk_full
from qkv._fs import check_output_path, make_temp_file, publish_file
from qkv.embeddings.errors import EmbeddingError, OutputFormatError

__all__ = ["open_writer", "output_format", "OUTPUT_FORMATS", "VectorWriter", "PARQUET_PIP"]

OUTPUT_FORMATS = (".npy", ".jsonl", ".parquet")
PARQUET_PIP = "pip install pyarrow"
_NPY_HEADER = 128  # bytes reserved for the .npy header: room for any row count


def output_format(path: str | os.PathLike) -> str:
    """The output format of ``path`` from its suffix.

    Raises:
        OutputFormatError: an unknown suffix, or ``.parquet`` without ``pyarrow`` installed.
    """
    suffix = Path(path).suffix.lower()
    if suffix not in OUTPUT_FORMATS:
        raise OutputFormatError(f"unknown output format {suffix or '(no suffix)'!r} for {path}; "
                                f"allowed: {', '.join(OUTPUT_FORMATS)}")
    if suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise OutputFormatError(f"writing {path} needs pyarrow, which is not installed; install it with "
                                    f"`{PARQUET_PIP}`, or write .npy or .jsonl instead") from None
    check_output_path(path)
    if not Path(path).parent.resolve().is_dir():
        raise OutputFormatError(f"cannot write {path}: folder {Path(path).parent} does not exist")
    return suffix


class VectorWriter(ABC):
    """Base writer: rows go to a temporary file; :meth:`commit` renames it into place, :meth:`abort`
    (or leaving a ``with`` block by an exception) removes it. Subclasses implement :meth:`_write`
    and :meth:`_finish`."""

    def __init__(self, path: str | os.PathLike, dim: int):
        self.path, self.dim, self.rows = Path(path), int(dim), 0
        fd, tmp = make_temp_file(self.path)  # also removes temp files of killed writers of this path
        os.close(fd)
        self.tmp = Path(tmp)
        self._done = False

    def write(self, ids: list, vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim or len(ids) != len(vectors):
            raise ValueError(f"expected {len(ids)} rows of width {self.dim}, got {vectors.shape}")
        if not np.isfinite(vectors).all():
            bad = [ids[i] for i in np.flatnonzero(~np.isfinite(vectors).all(axis=1))[:5]]
            raise EmbeddingError(f"non-finite (NaN/inf) vectors for document(s) {bad}: the model produces "
                                 "NaN/inf — its weights are damaged or it overflows; check the model folder")
        try:
            self._write(ids, vectors)
        except Exception as e:
            raise self._full(e)
        self.rows += len(ids)

    def commit(self) -> Path:
        try:
            self._finish()
            publish_file(self.tmp, self.path)  # with the permissions of a normal new file
        except Exception as e:
            raise self._full(e)
        self._done = True
        return self.path

    def _full(self, exc: Exception) -> Exception:
        """A full disk named as such, with the output's path (not the temporary file's); else ``exc``."""
        full = disk_full(exc, self.path)
        if full is None:
            return exc
        full.__cause__ = exc
        return full

    def abort(self) -> None:
        if not self._done:
            self._close_quietly()
            self.tmp.unlink(missing_ok=True)
            self._done = True

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        elif not self._done:
            self.commit()
        return False

    @abstractmethod
    def _write(self, ids: list, vectors: np.ndarray) -> None:
        """Append ``vectors`` (float32, ``(n, dim)``) with their ``ids`` to the temporary file."""

    @abstractmethod
    def _finish(self) -> None:
        """Flush and close the temporary file (it is renamed into place afterwards)."""

    def _close_quietly(self) -> None:
        pass


def npy_header(rows: int, dim: int) -> bytes:
    """A version-1.0 ``.npy`` header for float32 ``(rows, dim)``, exactly :data:`_NPY_HEADER` bytes."""
    text = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, dim)
    body_len = _NPY_HEADER - 10
    text = text.ljust(body_len - 1) + "\n"
    if len(text) != body_len:
        raise ValueError(f"shape ({rows}, {dim}) does not fit the reserved .npy header")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", body_len) + text.encode("latin1")


class _NpyWriter(VectorWriter):
    def __init__(self, path, dim):
        super().__init__(path, dim)
        self._fh = open(self.tmp, "wb")
        self._fh.write(npy_header(0, self.dim))

    def _write(self, ids, vectors):
        self._fh.write(vectors.astype("<f4", copy=False).tobytes())

    def _finish(self):
        self._fh.seek(0)
        self._fh.write(npy_header(self.rows, self.dim))
        self._fh.close()

    def _close_quietly(self):
        self._fh.close()


class _JsonlWriter(VectorWriter):
    def __init__(self, path, dim):
        super().__init__(path, dim)
        self._fh = io.open(self.tmp, "w", encoding="utf-8", newline="\n")

    def _write(self, ids, vectors):
        lines = []
        for rid, row in zip(ids, vectors.tolist()):
            vec = ",".join("%.9g" % x for x in row)
            lines.append(f'{{"id": {json.dumps(rid)}, "vector": [{vec}]}}\n')
        self._fh.write("".join(lines))

    def _finish(self):
        self._fh.close()

    def _close_quietly(self):
        self._fh.close()


class _ParquetWriter(VectorWriter):
    def __init__(self, path, dim):
        import pyarrow as pa  # lazy: an optional dependency; only Parquet output needs it
        import pyarrow.parquet as pq

        super().__init__(path, dim)
        self._pa = pa
        self._schema = pa.schema([("id", pa.string()), ("vector", pa.list_(pa.float32(), self.dim))])
        self._writer = pq.ParquetWriter(str(self.tmp), self._schema)

    def _write(self, ids, vectors):
        pa = self._pa
        flat = pa.array(vectors.reshape(-1), type=pa.float32())
        column = pa.FixedSizeListArray.from_arrays(flat, self.dim)
        table = pa.Table.from_arrays([pa.array([str(i) for i in ids], pa.string()), column],
                                     schema=self._schema)
        self._writer.write_table(table)

    def _finish(self):
        self._writer.close()

    def _close_quietly(self):
        try:
            self._writer.close()
        except Exception:  # already broken: the temp file is removed next
            pass


def open_writer(path: str | os.PathLike, dim: int) -> VectorWriter:
    """A writer for ``path`` (format from the suffix, see :func:`output_format`)."""
    fmt = output_format(path)
    return {".npy": _NpyWriter, ".jsonl": _JsonlWriter, ".parquet": _ParquetWriter}[fmt](path, dim)
