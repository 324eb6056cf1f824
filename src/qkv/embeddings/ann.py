"""Approximate nearest-neighbour indexes of an index folder, through FAISS (``faiss-cpu``).

Legend: N indexed vectors, Q queries, C the vector width, k results per query.

``qkv index --index TYPE``:

``exact`` (the default)
    no extra file: every query is scored against all N vectors, memory-mapped and read in blocks
    (:func:`qkv.embeddings.search.top_k`). Exact, no build time, O(N·C) work per query.
``faiss-ivf``
    ``faiss.IndexIVFFlat``: k-means cuts the vectors into ``nlist`` cells (trained on a seeded sample
    of at most 64 vectors per cell); a query scans the ``nprobe`` cells nearest to it. With
    ``nprobe = nlist`` it is exact.
``faiss-hnsw``
    ``faiss.IndexHNSWFlat``: a navigable small-world graph of ``hnsw_m`` links per vector, built with
    ``ef_construction`` candidates; a query walks it keeping ``ef_search`` candidates.

Both score by inner product, which is the cosine of the normalised vectors an index holds, and both
keep the full vectors (flat storage: no compression). The FAISS index is written as ``ann.faiss``
beside ``vectors.npy`` and loaded into memory when the index is opened; the folder's ``index.json``
records its type and parameters. Measured recall and latency: ``docs/embeddings.md``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qkv._fs import sha256_file
from qkv.embeddings.errors import EmbeddingError
from qkv.validation import check_choice, check_int

__all__ = ["INDEX_TYPES", "ANN_FILE", "AnnOptions", "build_ann", "open_ann", "AnnIndex", "FAISS_PIP", "default_nlist",
           "check_search_parameters"]

INDEX_TYPES = ("exact", "faiss-ivf", "faiss-hnsw")
ANN_FILE = "ann.faiss"
FAISS_PIP = "pip install faiss-cpu"
_ADD_BLOCK = 1 << 16  # vectors added to a FAISS index at a time (the rest stay memory-mapped)
_TRAIN_PER_CELL = 64  # k-means training vectors per IVF cell at most


def _faiss():
    try:
        import faiss  # optional dependency (the `index` extra); 0.23 s to import
    except ImportError:
        raise EmbeddingError(f"approximate indexes need faiss-cpu, which is not installed; install it with "
                             f"`{FAISS_PIP}` (or `pip install qkv[index]`), or use --index exact") from None
    return faiss


@dataclass(frozen=True)
class AnnOptions:
    """Which index and its parameters (validated).

    Attributes:
        type: one of :data:`INDEX_TYPES`.
        nlist: IVF cells; ``None``: ≈ √N (at least 1, at most N / 39 so that k-means has data).
        nprobe: IVF cells scanned per query (more: higher recall, slower).
        hnsw_m: HNSW links per vector.
        ef_construction: HNSW candidates kept while building.
        ef_search: HNSW candidates kept per query (at least k).
        seed: the IVF training sample and k-means.
    """

    type: str = "exact"
    nlist: int | None = None
    nprobe: int = 16
    hnsw_m: int = 32
    ef_construction: int = 40
    ef_search: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("index", self.type, INDEX_TYPES, error=EmbeddingError)
        check_int("nlist", self.nlist, low=1, optional=True, error=EmbeddingError)
        for name in ("nprobe", "hnsw_m", "ef_construction", "ef_search"):
            check_int(name, getattr(self, name), low=1, error=EmbeddingError)
        check_int("seed", self.seed, low=0, error=EmbeddingError)

    @classmethod
    def of(cls, type: str = "exact", **given: Any) -> AnnOptions:
        """The options of index ``type`` with the parameters ``given`` (``None`` values: not given).

        Raises:
            EmbeddingError: a parameter of another index type (it would be ignored), or a bad value.
        """
        given = {k: v for k, v in given.items() if v is not None}
        foreign = sorted(set(given) - set(_PARAMETERS.get(type, ())))
        if foreign:
            flags = ", ".join("--" + k.replace("_", "-") for k in foreign)
            raise EmbeddingError(f"{flags}: not a parameter of --index {type}; "
                                 + "; ".join(f"{t}: {', '.join('--' + p.replace('_', '-') for p in ps)}"
                                             for t, ps in _PARAMETERS.items()))
        return cls(type=type, **given)

    @property
    def approximate(self) -> bool:
        return self.type != "exact"

    def replace(self, **changes: Any) -> AnnOptions:
        return dataclasses.replace(self, **changes)


#: The parameters of each approximate index type (``seed`` is everyone's).
_PARAMETERS = {"faiss-ivf": ("nlist", "nprobe", "seed"), "faiss-hnsw": ("hnsw_m", "ef_construction", "ef_search")}


def default_nlist(n: int) -> int:
    """IVF cells for N vectors: ≈ √N, at most N / 39 (k-means wants ~39 vectors per cell)."""
    return max(1, min(int(round(math.sqrt(n))), n // 39))


def build_ann(vectors: np.ndarray, options: AnnOptions, folder: Path) -> dict[str, Any]:
    """Build the index ``options`` names over ``vectors`` ``(N,C)`` (normalised float32, may be
    memory-mapped) and write it to ``folder/ann.faiss``; returns the record ``index.json`` keeps.
    An ``exact`` index writes nothing."""
    n, dim = vectors.shape
    record: dict[str, Any] = {"type": options.type}
    if not options.approximate:
        return record
    faiss = _faiss()
    if options.type == "faiss-ivf":
        nlist = options.nlist or default_nlist(n)
        if nlist > n:
            raise EmbeddingError(f"--nlist {nlist} exceeds the {n} vectors of the index; give at most {n}")
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = options.seed
        index.cp.max_points_per_centroid = _TRAIN_PER_CELL
        rng = np.random.default_rng(options.seed)
        sample = np.sort(rng.choice(n, size=min(n, nlist * _TRAIN_PER_CELL), replace=False))
        index.train(np.ascontiguousarray(vectors[sample], dtype=np.float32))
        record.update(nlist=nlist, nprobe=min(options.nprobe, nlist))
    else:
        index = faiss.IndexHNSWFlat(dim, options.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = options.ef_construction
        record.update(hnsw_m=options.hnsw_m, ef_construction=options.ef_construction, ef_search=options.ef_search)
    for start in range(0, n, _ADD_BLOCK):
        index.add(np.ascontiguousarray(vectors[start:start + _ADD_BLOCK], dtype=np.float32))
    faiss.write_index(index, str(Path(folder) / ANN_FILE))
    record["faiss"] = faiss.__version__
    record["sha256"] = sha256_file(Path(folder) / ANN_FILE)  # FAISS keeps its own copy of the vectors
    return record


class AnnIndex:
    """An ``ann.faiss`` opened for queries, with its search parameters.

    Raises:
        EmbeddingError: faiss missing, the file missing or damaged, or not of the index's size.
    """

    def __init__(self, folder: Path, record: dict[str, Any], count: int, dim: int):
        faiss = _faiss()
        path = Path(folder) / ANN_FILE
        if path.is_file() and record.get("sha256") not in (None, sha256_file(path)):
            # its vectors are a copy of vectors.npy (checked finite when opened): a changed file could rank
            # around a damaged (NaN) vector unnoticed
            raise EmbeddingError(f"{path} changed since the index was built (damaged or replaced); rebuild the "
                                 "index with qkv index")
        try:
            self.index = faiss.read_index(str(path))
        except RuntimeError as e:
            first = (str(e).strip().splitlines() or ["unreadable"])[-1][:200]
            raise EmbeddingError(f"{path}: cannot be read ({first}); rebuild the index with qkv index") from None
        if self.index.ntotal != count or self.index.d != dim:
            raise EmbeddingError(f"{path} holds {self.index.ntotal} × {self.index.d} vectors, index.json says "
                                 f"{count} × {dim}: rebuild the index with qkv index")
        self.type, self.record, self._faiss = record["type"], record, faiss

    def search(self, queries: np.ndarray, k: int, *, nprobe: int | None = None,
               ef_search: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(Q,k)`` scores and rows, best first (rows of ``-1`` where fewer than k were found)."""
        check_search_parameters(self.type, nprobe=nprobe, ef_search=ef_search)
        faiss, q = self._faiss, np.ascontiguousarray(queries, dtype=np.float32)
        if self.type == "faiss-ivf":
            params = faiss.SearchParametersIVF(nprobe=min(nprobe or self.record["nprobe"], self.record["nlist"]))
        else:
            params = faiss.SearchParametersHNSW(efSearch=max(ef_search or self.record["ef_search"], k))
        scores, rows = self.index.search(q, k, params=params)  # (Q,k), (Q,k)
        return scores, rows


def check_search_parameters(index_type: str, *, nprobe: int | None = None, ef_search: int | None = None) -> None:
    """Refuse a search breadth the index does not have (``nprobe``: faiss-ivf, ``ef_search``:
    faiss-hnsw) or below 1.

    Raises:
        EmbeddingError: naming the parameter and the index type.
    """
    for name, value, owner in (("nprobe", nprobe, "faiss-ivf"), ("ef_search", ef_search, "faiss-hnsw")):
        if value is None:
            continue
        check_int(name, value, low=1, error=EmbeddingError)
        if index_type != owner:
            raise EmbeddingError(f"--{name.replace('_', '-')} sets how widely a {owner} index searches; this index "
                                 f"is {index_type} (built with qkv index --index {index_type})")


def open_ann(folder: Path, meta: dict[str, Any]) -> AnnIndex | None:
    """The approximate index of an index folder (``None`` for an exact one, or a folder made before
    index types existed)."""
    record = meta.get("index")
    if not isinstance(record, dict) or record.get("type", "exact") == "exact":
        return None
    if record.get("type") not in INDEX_TYPES:
        raise EmbeddingError(f"{Path(folder) / 'index.json'}: unknown index type {record.get('type')!r}; rebuild "
                             "the index with qkv index")
    return AnnIndex(folder, record, int(meta["count"]), int(meta["dim"]))
