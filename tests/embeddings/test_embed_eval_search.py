"""Evaluation metrics against hand computations, `qkv eval-embeddings` on a tiny subset, and search."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qkv.cli import main
from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.evaluate import knn_accuracy, retrieval_map
from qkv.embeddings.search import SearchIndex, build_index, search


def test_map_and_knn_by_hand():
    # four unit vectors at angles 0, 0.3, 1.2, 1.4 (cosine falls with the angle between them)
    ang = np.array([0.0, 0.3, 1.2, 1.4])
    x = np.stack([np.cos(ang), np.sin(ang)], axis=1)
    y = np.array([0, 0, 1, 1])  # every query's nearest neighbour is its only relevant document: MAP 1
    y2 = np.array([0, 1, 0, 1])
    # with y2: q0 ranks 1,2,3 → relevant 2 at rank 2 → AP 1/2; q1 ranks 0,2,3 → rank 3 → 1/3;
    # q2 ranks 3,1,0 → rank 3 → 1/3; q3 ranks 2,1,0 → rank 2 → 1/2
    assert retrieval_map(x, y) == pytest.approx(1.0)
    assert retrieval_map(x, y2) == pytest.approx(np.mean([1 / 2, 1 / 3, 1 / 3, 1 / 2]))
    train, train_y = x, y
    test = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert knn_accuracy(train, train_y, test, np.array([0, 1]), k=1) == 1.0
    assert knn_accuracy(train, train_y, test, np.array([1, 0]), k=3) == 0.0


def test_eval_embeddings_command_on_a_tiny_subset(tiny_model, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["eval-embeddings", str(tiny_model), "--dataset", "reuters8", "--max-train", "40",
                 "--max-test", "24", "--max-len", "24", "--out", str(out), "--no-progress", "--k", "3"]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert [r["model"] for r in result["results"]] == ["TF-IDF", str(tiny_model)]
    assert result["test_documents"] == 24 and result["train_documents"] == 40
    assert any("subsample of 24 of" in n for n in result["notes"]) and "subsample" in printed
    for row in result["results"]:
        for key in ("knn_accuracy", "logreg_accuracy", "map"):
            assert 0.0 <= row[key] <= 1.0
    assert "| TF-IDF |" in printed


def test_eval_on_a_jsonl_file(tiny_model, tmp_path):
    from qkv.embeddings.evaluate import load_eval_data

    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"text {i} {'cats' if i % 2 else 'dogs'}", "label": i % 2})
                              for i in range(16)), encoding="utf-8")
    data = load_eval_data(str(path))
    assert len(data.test_texts) == 4 and len(data.train_texts) == 12 and data.notes
    with pytest.raises(EmbeddingError, match="unknown dataset"):
        load_eval_data("no-such-dataset")


def test_eval_files_csv_tsv_gz_and_splits(tmp_path):
    import gzip

    from qkv.embeddings.evaluate import load_eval_data

    csv_path = tmp_path / "d.csv"
    csv_path.write_text("text,label,split\n" + "".join(f'"text {i}, with a comma",{i % 3},{"test" if i < 3 else "train"}\n'
                                                        for i in range(10)), encoding="utf-8")
    data = load_eval_data(str(csv_path))
    assert data.test_texts == [f"text {i}, with a comma" for i in range(3)] and data.test_labels == ["0", "1", "2"]
    assert len(data.train_texts) == 7 and data.train_labels[0] == "0" and not data.notes
    tsv = tmp_path / "d.tsv.gz"
    with gzip.open(tsv, "wt", encoding="utf-8") as fh:
        fh.write("label\ttext\tsplit\n" + "".join(f"{'ab'[i % 2]}\tdoc {i}\t\n" for i in range(8)))
    data = load_eval_data(str(tsv))  # an empty split cell: no split, the seeded 25 %
    assert len(data.test_texts) == 2 and len(data.train_texts) == 6 and "without a split field" in data.notes[0]
    assert sorted(data.test_texts + data.train_texts) == sorted(f"doc {i}" for i in range(8))
    assert load_eval_data(str(tsv)).test_texts == data.test_texts, "the split is seeded"


@pytest.mark.parametrize("name,body,message", [
    ("a.jsonl", '{"text": "x", "label": 1}\n{"text": "y"}\n', r"a\.jsonl:2: expected the fields 'text' and 'label'"),
    ("b.jsonl", '{"text": "x", "label": 1, "split": "dev"}\n', r"b\.jsonl:1: split 'dev'; allowed: train, test"),
    ("c.jsonl", '{"text": "x", "label": null}\n', r"c\.jsonl:1: the 'label' field is None; every document needs a label"),
    ("d.csv", "text,label\nx,\n", r"d\.csv:2: the 'label' field is ''"),
    ("e.jsonl", '{"text": "x", "label": 1}\n{not json\n', r"e\.jsonl, line 2: not valid JSON"),
    ("f.csv", "text,label\nx,1,extra\n", r"f\.csv, line 2: 3 fields, but the header has 2"),
    ("g.txt", "x\n", r"unknown dataset .*g\.txt.*\.jsonl, \.csv or \.tsv"),
    ("h.txt.gz", "x\n", r"unknown dataset .*h\.txt\.gz"),
])
def test_eval_files_are_checked(tmp_path, name, body, message):
    from qkv.embeddings.evaluate import load_eval_data

    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    with pytest.raises(EmbeddingError, match=message):
        load_eval_data(str(path))
    with pytest.raises(EmbeddingError, match=r"no\.jsonl.*no such file"):
        load_eval_data(str(tmp_path / "no.jsonl"))


def test_search_finds_the_exact_document(tiny_model, tmp_path, pydoc_texts, capsys):
    docs = [" ".join(t.split()[:60]) for t in pydoc_texts[:30]]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps({"id": f"doc{i}", "text": d}) for i, d in enumerate(docs)) + "\n",
                      encoding="utf-8")
    index = tmp_path / "idx"
    assert main(["index", str(tiny_model), str(corpus), "--out", str(index), "--no-progress"]) == 0
    assert "indexed 30 documents" in capsys.readouterr().out
    hits = search(index, [docs[17], docs[3]], k=5)
    assert [h[0].id for h in hits] == ["doc17", "doc3"]
    assert hits[0][0].score == pytest.approx(1.0, abs=1e-5) and hits[0][0].text == docs[17]
    assert all(a.score >= b.score for a, b in zip(hits[0], hits[0][1:]))
    assert main(["search", str(index), docs[17], "-k", "2", "--json"]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["id"] == "doc17" and first["rank"] == 1
    with pytest.raises(EmbeddingError, match="not an empty folder"):
        build_index(tiny_model, [(1, "x")], index)
    opened = SearchIndex(index)  # opened once, queried many times: the same hits as search()
    assert len(opened) == 30
    for query in (docs[17], docs[3]):
        assert opened.query(query, k=5) == search(index, query, k=5)
    with pytest.raises(EmbeddingError, match="query 2 is empty"):
        opened.query(["fine", " "])


def test_search_refuses_a_changed_model(tiny_model, tmp_path):
    import shutil

    model = tmp_path / "m"
    shutil.copytree(tiny_model, model)
    build_index(model, [(i, f"text number {i}") for i in range(5)], tmp_path / "idx", progress=False)
    with open(model / "model.safetensors", "r+b") as fh:  # corrupt the weights in place
        fh.seek(-4, 2)
        fh.write(b"\0\0\0\1")
    with pytest.raises(EmbeddingError, match="changed since the index was built"):
        search(tmp_path / "idx", "text")
