"""``qkv index --index exact | faiss-ivf | faiss-hnsw``: the FAISS indexes against exact search (the
same neighbours with exhaustive parameters), the index folder and its record, the CLI, damaged files,
and the message without faiss."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from qkv.cli import main
from qkv.embeddings.ann import ANN_FILE, AnnOptions, build_ann, default_nlist, open_ann
from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.search import SearchIndex, build_index, search, top_k

pytest.importorskip("faiss", reason="faiss-cpu is not installed: pip install faiss-cpu (make test installs it)")


def _unit(rows: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("options, exhaustive", [
    (AnnOptions(type="faiss-ivf", nlist=10), {"nprobe": 10}),
    (AnnOptions(type="faiss-hnsw", hnsw_m=8), {"ef_search": 600}),
])
def test_faiss_indexes_with_exhaustive_parameters_find_the_exact_neighbours(tmp_path, options, exhaustive):
    vectors, queries = _unit(600, 24, 0), _unit(25, 24, 1)
    want_s, want_r = top_k(vectors, queries, 10)  # exact: every vector scored
    record = build_ann(vectors, options, tmp_path)
    assert (tmp_path / ANN_FILE).is_file() and record["type"] == options.type
    got_s, got_r = open_ann(tmp_path, {"index": record, "count": 600, "dim": 24}).search(queries, 10, **exhaustive)
    np.testing.assert_array_equal(got_r, want_r)
    np.testing.assert_allclose(got_s, want_s, atol=1e-5)


def test_exact_writes_no_structure_and_ivf_cells_follow_the_corpus_size(tmp_path):
    assert build_ann(_unit(50, 8, 0), AnnOptions(), tmp_path) == {"type": "exact"}
    assert not (tmp_path / ANN_FILE).exists()
    assert [default_nlist(n) for n in (10, 1_000, 100_000, 1_000_000)] == [1, 25, 316, 1000]
    with pytest.raises(EmbeddingError, match="--nlist 60 exceeds the 50 vectors"):
        build_ann(_unit(50, 8, 0), AnnOptions(type="faiss-ivf", nlist=60), tmp_path)
    with pytest.raises(EmbeddingError, match=r"index='annoy' is not allowed; allowed: exact, faiss-ivf, faiss-hnsw"):
        AnnOptions(type="annoy")
    with pytest.raises(EmbeddingError, match="nprobe=0 must be an int ≥ 1"):
        AnnOptions(type="faiss-ivf", nprobe=0)
    assert AnnOptions.of("faiss-ivf", nlist=4, nprobe=None) == AnnOptions(type="faiss-ivf", nlist=4)
    with pytest.raises(EmbeddingError, match="--ef-search, --nlist: not a parameter of --index exact"):
        AnnOptions.of("exact", nlist=4, ef_search=9)


@pytest.fixture(scope="module")
def corpus(pydoc_texts):
    return [(f"doc{i}", t[:400]) for i, t in enumerate(pydoc_texts)]  # 79 topics


def test_an_hnsw_index_folder_answers_like_the_exact_one(tmp_path, tiny_model, corpus):
    exact = tmp_path / "exact"
    meta = build_index(tiny_model, corpus, exact)
    assert meta["index"] == {"type": "exact"}
    hnsw = tmp_path / "hnsw"
    meta = build_index(tiny_model, corpus, hnsw, ann=AnnOptions(type="faiss-hnsw", hnsw_m=8, ef_search=200))
    assert meta["index"]["type"] == "faiss-hnsw" and json.loads((hnsw / "index.json").read_text())["index"]["ef_search"] == 200
    assert (np.load(exact / "vectors.npy") == np.load(hnsw / "vectors.npy")).all()  # the same vectors
    queries = ["the value of a class attribute", "a for loop over a sequence"]
    want = SearchIndex(exact).query(queries, k=5)
    got = SearchIndex(hnsw).query(queries, k=5)
    assert [[h.id for h in hits] for hits in got] == [[h.id for h in hits] for hits in want]
    assert [h.score for h in got[0]] == pytest.approx([h.score for h in want[0]], abs=1e-5)


def test_the_command_line_builds_and_searches_an_ivf_index(tmp_path, tiny_model, corpus, capsys):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in corpus))
    out = tmp_path / "ivf"
    assert main(["index", str(tiny_model), str(src), "--out", str(out), "--index", "faiss-ivf", "--nlist", "3",
                 "--nprobe", "3", "--no-progress"]) == 0
    assert f"indexed {len(corpus)} documents" in capsys.readouterr().out and (out / ANN_FILE).is_file()
    assert main(["search", str(out), "a class attribute", "-k", "3", "--json", "--nprobe", "1"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["rank"] for x in lines] == [1, 2, 3]
    exact = search(out, "a class attribute", k=3, nprobe=3)[0]  # every cell: the exact answer
    with pytest.raises(EmbeddingError, match="--ef-search sets how widely a faiss-hnsw index searches; this index "
                                             "is faiss-ivf"):
        search(out, "a class attribute", ef_search=10)
    assert [h.id for h in exact] == [h.id for h in SearchIndex(out).query("a class attribute", k=3, nprobe=3)[0]]


def test_a_damaged_or_mismatched_faiss_file_is_refused(tmp_path, tiny_model, corpus):
    out = tmp_path / "ix"
    build_index(tiny_model, corpus[:60], out, ann=AnnOptions(type="faiss-ivf", nlist=2))
    other = tmp_path / "other"
    build_ann(_unit(59, 24, 0), AnnOptions(type="faiss-ivf", nlist=1), other.mkdir() or other)
    (out / ANN_FILE).write_bytes((other / ANN_FILE).read_bytes())
    with pytest.raises(EmbeddingError, match=r"ann.faiss changed since the index was built .*rebuild the index"):
        SearchIndex(out)  # the checksum index.json records
    meta = json.loads((out / "index.json").read_text())
    _drop_key(meta, "sha256")  # an index built before the checksum: the shape and the reader still refuse
    (out / "index.json").write_text(json.dumps(meta))
    with pytest.raises(EmbeddingError, match=r"holds 59 × 24 vectors, index.json says 60 × 24: rebuild"):
        SearchIndex(out)
    (out / ANN_FILE).write_bytes(b"not a faiss index")
    with pytest.raises(EmbeddingError, match="ann.faiss: cannot be read"):
        SearchIndex(out)


def _drop_key(data, key: str) -> None:
    if isinstance(data, dict):
        data.pop(key, None)
        for value in data.values():
            _drop_key(value, key)
    elif isinstance(data, list):
        for value in data:
            _drop_key(value, key)


def test_without_faiss_the_message_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss → ImportError
    with pytest.raises(EmbeddingError, match=r"need faiss-cpu, which is not installed; install it with `pip install "
                                             r"faiss-cpu`.*or use --index exact"):
        build_ann(_unit(50, 8, 0), AnnOptions(type="faiss-hnsw"), tmp_path)
