"""`qkv embed`: formats, streaming, stdin, and bad input that must leave no output behind."""

from __future__ import annotations

import io
import json
import shutil
import sys

import numpy as np
import pytest

import qkv
from qkv.cli import main
from qkv.data.readers import read_records
from qkv.embeddings.streams import npy_header, output_format
from qkv.embeddings.errors import OutputFormatError

DOCS = ["the def statement defines a function", "", "classes and objects", "while loops repeat", "  ",
        "the import system finds modules"]


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("\n".join(DOCS) + "\n", encoding="utf-8")
    return path


def test_npy_and_jsonl_match_the_api(tiny_model, text_file, tmp_path, capsys):
    ref = qkv.embed(tiny_model, [d for d in DOCS if d.strip()])
    assert main(["embed", str(tiny_model), str(text_file), "--out", str(tmp_path / "v.npy"), "--no-progress",
                 "--chunk-size", "2"]) == 0
    assert "2 empty documents left out (ids 2, 5)" in capsys.readouterr().out
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), ref, atol=1e-6)
    assert main(["embed", str(tiny_model), str(text_file), "--out", str(tmp_path / "v.jsonl"),
                 "--no-progress"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [1, 3, 4, 6]  # line numbers
    np.testing.assert_allclose(np.array([r["vector"] for r in rows], np.float32), ref, atol=0)  # exact
    assert _leftovers(tmp_path) == []


def test_empty_modes_on_the_command_line(tiny_model, text_file, tmp_path, capsys):
    out = tmp_path / "z.npy"
    assert main(["embed", str(tiny_model), str(text_file), "--out", str(out), "--empty", "zero",
                 "--no-progress"]) == 0
    vecs = np.load(out)
    assert vecs.shape == (6, 24) and not vecs[1].any() and not vecs[4].any()
    err = tmp_path / "e.npy"
    assert main(["embed", str(tiny_model), str(text_file), "--out", str(err), "--empty", "error",
                 "--no-progress"]) == 2
    assert "empty document" in capsys.readouterr().err
    assert not err.exists() and _leftovers(tmp_path) == []


def test_jsonl_input_and_stdin(tiny_model, tmp_path, monkeypatch):
    src = tmp_path / "docs.jsonl"
    src.write_text("\n".join(json.dumps({"id": f"d{i}", "body": d}) for i, d in enumerate(DOCS[:4]) if d),
                   encoding="utf-8")
    assert main(["embed", str(tiny_model), str(src), "--out", str(tmp_path / "j.jsonl"), "--text-field",
                 "body", "--no-progress"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "j.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["d0", "d2", "d3"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("classes and objects\n".encode())))
    assert main(["embed", str(tiny_model), "-", "--out", str(tmp_path / "s.npy"), "--no-progress"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "s.npy")[0], rows[1]["vector"], atol=1e-6)


def test_non_utf8_input_fails_without_partial_output(tiny_model, tmp_path, capsys):
    src = tmp_path / "latin1.txt"
    src.write_bytes(b"fine line\nanother fine line\ncaf\xe9 au lait\n")
    out = tmp_path / "v.npy"
    assert main(["embed", str(tiny_model), str(src), "--out", str(out), "--chunk-size", "1",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "not valid UTF-8 at line 3, byte offset 31" in err and "--encoding-errors replace" in err
    assert not out.exists() and _leftovers(tmp_path) == []  # the first chunks were written, then removed
    assert main(["embed", str(tiny_model), str(src), "--out", str(out), "--encoding-errors", "replace",
                 "--no-progress"]) == 0
    assert np.load(out).shape == (3, 24)


def test_model_without_tokenizer_fails_before_writing(tiny_model, text_file, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("qkv.json", "model.safetensors"):
        shutil.copy(tiny_model / name, bare / name)
    out = tmp_path / "v.npy"
    assert main(["embed", str(bare), str(text_file), "--out", str(out), "--no-progress"]) == 2
    assert "has no tokenizer" in capsys.readouterr().err
    assert not out.exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("name", ["v.csv", "v", "v.npz"])
def test_unknown_output_format(tiny_model, text_file, tmp_path, capsys, name):
    code = main(["embed", str(tiny_model), str(text_file), "--out", str(tmp_path / name), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "unknown output format" in err and "allowed: .npy, .jsonl, .parquet" in err
    assert not (tmp_path / name).exists() and _leftovers(tmp_path) == []


def test_parquet_needs_pyarrow_or_writes(tiny_model, text_file, tmp_path, capsys):
    out = tmp_path / "v.parquet"
    code = main(["embed", str(tiny_model), str(text_file), "--out", str(out), "--no-progress"])
    try:
        import pyarrow.parquet as pq
    except ImportError:
        assert code == 2 and "pip install pyarrow" in capsys.readouterr().err and not out.exists()
        return
    assert code == 0
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == ["1", "3", "4", "6"]
    np.testing.assert_allclose(np.array(table.column("vector").to_pylist(), np.float32),
                               qkv.embed(tiny_model, [d for d in DOCS if d.strip()]), atol=0)


def test_npy_header_holds_any_count(tmp_path):
    for rows in (0, 7, 10**12):
        path = tmp_path / "h.npy"
        data = np.zeros((rows, 384), "<f4").tobytes() if rows < 10 else b""
        path.write_bytes(npy_header(rows, 384) + data)
        if rows < 10:
            assert np.load(path).shape == (rows, 384)
        assert len(npy_header(rows, 384)) == 128


def test_input_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": "no field"}\n', encoding="utf-8")
    with pytest.raises(Exception, match=r"line 2: expected a JSON object with a 'text' field"):
        list(read_records(str(bad)))
    with pytest.raises(Exception, match="input file not found"):
        list(read_records(str(tmp_path / "missing.txt")))
    with pytest.raises(OutputFormatError, match="does not exist"):
        output_format(tmp_path / "no" / "such" / "v.npy")


def test_streaming_reads_lazily(tiny_model):
    """A chunk is embedded and handed on before the next one is read: memory is one chunk."""
    from qkv.embeddings.embedder import Embedder

    consumed = []

    def endless():
        i = 0
        while True:
            consumed.append(i)
            yield i, f"document {i}"
            i += 1

    stream = Embedder(tiny_model, chunk_size=5).embed_stream(endless())
    ids, vecs = next(stream)
    assert ids == [0, 1, 2, 3, 4] and vecs.shape == (5, 24) and len(consumed) == 5
    ids, _ = next(stream)
    assert ids == [5, 6, 7, 8, 9] and len(consumed) == 10
    stream.close()


def test_csv_and_tsv_inputs_are_read_by_column_as_finetune_reads_them(tiny_model, tmp_path, capsys):
    texts = ["first, with a comma", "second"]
    (tmp_path / "t.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    (tmp_path / "t.csv").write_text('id,text\nd1,"first, with a comma"\nd2,second\n', encoding="utf-8")
    (tmp_path / "t.tsv").write_text("body\tkey\nfirst, with a comma\td1\nsecond\td2\n", encoding="utf-8")
    common = ["--no-progress"]
    assert main(["embed", str(tiny_model), str(tmp_path / "t.txt"), "--out", str(tmp_path / "t.npy"), *common]) == 0
    assert main(["embed", str(tiny_model), str(tmp_path / "t.csv"), "--out", str(tmp_path / "c.jsonl"), *common]) == 0
    assert main(["embed", str(tiny_model), str(tmp_path / "t.tsv"), "--out", str(tmp_path / "s.jsonl"),
                 "--text-field", "body", "--id-field", "key", *common]) == 0
    want = np.load(tmp_path / "t.npy")
    for name in ("c.jsonl", "s.jsonl"):
        rows = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        assert [r["id"] for r in rows] == ["d1", "d2"]  # no header document, no id glued to the text
        np.testing.assert_allclose(np.array([r["vector"] for r in rows]), want, atol=1e-6)
    capsys.readouterr()
    assert main(["embed", str(tiny_model), str(tmp_path / "t.csv"), "--out", str(tmp_path / "x.npy"),
                 "--text-field", "body", *common]) == 2
    assert "no column 'body' (columns: 'id', 'text'); choose it with --text-field" in capsys.readouterr().err


def test_an_existing_output_is_replaced_only_with_force_and_never_the_input(tiny_model, tmp_path, capsys):
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "classes and objects"}\n', encoding="utf-8")
    out = tmp_path / "v.npy"
    out.write_bytes(b"an earlier result")
    assert main(["embed", str(tiny_model), str(src), "--out", str(out), "--no-progress"]) == 2
    assert "exists; add --force to replace it" in capsys.readouterr().err
    assert out.read_bytes() == b"an earlier result"
    assert main(["embed", str(tiny_model), str(src), "--out", str(out), "--force", "--no-progress"]) == 0
    assert np.load(out).shape[0] == 1
    assert main(["embed", str(tiny_model), str(src), "--out", str(src), "--force", "--no-progress"]) == 2
    assert "is the input" in capsys.readouterr().err and src.read_text().startswith('{"text"')
