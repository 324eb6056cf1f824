"""The one record reader of qkv embed / index / predict: read_records and input_format (qkv.data.readers)."""

from __future__ import annotations

import gzip
import io
import sys

import pytest

from qkv.data.errors import CorpusDecodeError, CorpusError, CorpusFormatError, CorpusNotFoundError
from qkv.data.readers import DEFAULT_MAX_DOC_BYTES, input_format, iter_records, read_records


def test_text_lines_are_documents_with_line_numbers(tmp_path):
    f = tmp_path / "docs.txt"
    f.write_bytes(b"\xef\xbb\xbffirst line\r\n\n  third  \nlast")
    assert list(read_records(f)) == [(1, "first line"), (2, ""), (3, "  third  "), (4, "last")]
    g = tmp_path / "docs.txt.gz"
    g.write_bytes(gzip.compress(f.read_bytes()))
    assert list(read_records(str(g))) == list(read_records(f))


def test_jsonl_ids_fields_and_blank_lines(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"id": "a", "text": "one"}\n\n{"body": "two"}\n', encoding="utf-8")
    with pytest.raises(CorpusFormatError, match=r"line 3: expected a JSON object with a 'text' field.*'body'"):
        list(read_records(f))
    assert next(read_records(f, fmt="jsonl", text_field="id")) == ("a", "a")
    f.write_text('{"id": "a", "text": "one"}\n\n{"text": "two"}\n', encoding="utf-8")
    assert list(read_records(f)) == [("a", "one"), (3, "two")]
    assert list(read_records(f, fmt="text"))[1] == (2, "")  # read as text: every line is a document
    f.write_text('{"id": 7, "text": "one"}\n', encoding="utf-8")
    assert list(read_records(f)) == [(7, "one")]
    with pytest.raises(CorpusFormatError, match=r"line 1: field 'id' must be a string, got int"):
        list(read_records(f, text_field="id"))


def test_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a\nb\n")))
    assert list(read_records("-")) == [(1, "a"), (2, "b")]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"text": "x"}\n')))
    assert list(read_records("-", fmt="jsonl")) == [(1, "x")]


def test_errors_name_file_line_and_fix(tmp_path):
    with pytest.raises(CorpusNotFoundError, match="input file not found"):
        list(read_records(tmp_path / "missing.txt"))
    with pytest.raises(CorpusNotFoundError, match=r"\(it is a folder\)"):
        list(read_records(tmp_path))
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("ok\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(CorpusDecodeError, match=r"not valid UTF-8 at line 2, byte offset 6 .*--encoding-errors replace"):
        list(read_records(bad))
    assert list(read_records(bad, encoding_errors="replace"))[1] == (2, "caf\ufffd")
    broken = tmp_path / "x.jsonl"
    broken.write_text('{"text": "a",}\n')
    with pytest.raises(CorpusFormatError, match=r"x\.jsonl, line 1: not valid JSON"):
        list(read_records(broken))
    gz = tmp_path / "y.txt.gz"
    gz.write_bytes(b"not gzip")
    with pytest.raises(CorpusError, match="not a readable gzip file"):
        list(read_records(gz))
    with pytest.raises(CorpusFormatError, match="input format 'xml' is not allowed; allowed: text, jsonl, csv, tsv"):
        input_format("a.csv", "xml")
    assert input_format("a.JSONL.gz") == "jsonl" and input_format("a.csv") == "csv"
    assert input_format("a.tsv.gz") == "tsv" and input_format("a.md") == "text"


def test_lines_of_any_length_stream(tmp_path):
    """Documents to embed have no length limit (the embedder windows them); corpora and records do."""
    f = tmp_path / "long.txt"
    f.write_text("word " * (DEFAULT_MAX_DOC_BYTES // 5 + 10) + "\nshort\n", encoding="utf-8")
    (one, text), two = list(read_records(f))
    assert len(text.encode()) > DEFAULT_MAX_DOC_BYTES and two == (2, "short")


def test_records_share_the_json_line_reader(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text('{"text": "a", "label": 1}\n\n[1]\n', encoding="utf-8")
    with pytest.raises(CorpusFormatError, match=r"r\.jsonl, line 3: expected a JSON object, got list"):
        list(iter_records(f))
    assert next(iter_records(f)) == (f"{f}:1", {"text": "a", "label": 1})


def test_iter_records_headerless_columns_and_quoting(tmp_path):
    f = tmp_path / "r.tsv"
    f.write_text('a\t"b\tc"\n"x" y\tz\n', encoding="utf-8")
    # default: the first row names the columns, csv's lenient quoting (unchanged behaviour)
    assert list(iter_records(f)) == [(f"{f}:2", {"a": "x y", "b\tc": "z"})]
    assert list(iter_records(f, columns=("s", "t"))) == [
        (f"{f}:1", {"s": "a", "t": "b\tc"}), (f"{f}:2", {"s": "x y", "t": "z"})]
    with pytest.raises(CorpusFormatError, match=r"r\.tsv, line 2: not valid TSV"):
        list(iter_records(f, columns=("s", "t"), quotes="strict"))
    with pytest.raises(CorpusFormatError, match=r"line 1: 3 fields, but the file has 2 \(s, t\)"):
        list(iter_records(f, columns=("s", "t"), quotes="none"))
    g = tmp_path / "g.tsv"
    g.write_text('"x" y\tz\n', encoding="utf-8")
    assert list(iter_records(g, columns=("s", "t"), quotes="none")) == [(f"{g}:1", {"s": '"x" y', "t": "z"})]
    with pytest.raises(ValueError, match="quotes='x' is not allowed"):
        list(iter_records(g, quotes="x"))


def test_a_duplicate_csv_header_is_refused(tmp_path):
    from qkv.data.readers import iter_records

    f = tmp_path / "dup.csv"
    f.write_text("text,label,text\nhello,1,other\n")
    with pytest.raises(CorpusFormatError, match=r"dup.csv: column\(s\) 'text' appear more than once in the header"):
        list(iter_records(f))


# --- CSV/TSV read the same way by every command (read_records: embed, index; corpus documents) -------


def test_read_records_reads_csv_and_tsv_by_column_not_as_lines(tmp_path):
    (tmp_path / "d.csv").write_text('id,text\nx1,"hello, world"\nx2,""\n', encoding="utf-8")
    (tmp_path / "d.tsv").write_text("text\tid\nhello, world\tx1\n\tx2\n", encoding="utf-8")
    expected = [("x1", "hello, world"), ("x2", "")]
    assert list(read_records(tmp_path / "d.csv")) == expected  # the header is no document, the id no text
    assert list(read_records(tmp_path / "d.tsv")) == expected
    (tmp_path / "noid.csv").write_text("text\na\nb\n", encoding="utf-8")
    assert list(read_records(tmp_path / "noid.csv")) == [(2, "a"), (3, "b")]  # ids: the rows' line numbers


def test_read_records_csv_from_stdin_and_gz(tmp_path, monkeypatch):
    import gzip
    import io

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbftext,id\nfrom stdin,7\n")))
    assert list(read_records("-", fmt="csv")) == [("7", "from stdin")]
    with gzip.open(tmp_path / "d.csv.gz", "wt") as f:
        f.write("text\nzipped\n")
    assert list(read_records(tmp_path / "d.csv.gz")) == [(2, "zipped")]


def test_read_records_csv_without_the_text_column_names_the_columns_and_the_option(tmp_path):
    (tmp_path / "d.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(CorpusFormatError, match=r"d\.csv, line 2: no column 'text' \(columns: 'a', 'b'\); "
                                                r"choose it with --text-field"):
        list(read_records(tmp_path / "d.csv"))
    assert list(read_records(tmp_path / "d.csv", text_field="b", id_field="a")) == [("1", "2")]
    with pytest.raises(CorpusFormatError, match="allowed: text, jsonl, csv, tsv"):
        list(read_records(tmp_path / "d.csv", fmt="xml"))


def test_csv_row_line_numbers_are_where_the_row_starts(tmp_path):
    (tmp_path / "d.csv").write_text('text,label\n"two\nlines",a\nnext,b\n', encoding="utf-8")
    assert [s for s, _ in iter_records(tmp_path / "d.csv")] == [f"{tmp_path / 'd.csv'}:2", f"{tmp_path / 'd.csv'}:4"]


def test_corpus_documents_from_csv_with_labels(tmp_path):
    from qkv.data.readers import CorpusOptions, iter_file_documents

    (tmp_path / "d.csv").write_text("text,topic\nfirst doc,x\n,y\nsecond,z\n", encoding="utf-8")
    docs = list(iter_file_documents(tmp_path / "d.csv", CorpusOptions(label_field="topic")))
    assert [(d.text, d.label) for d in docs] == [("first doc", "x"), ("second", "z")]
    with pytest.raises(CorpusFormatError, match=r"no column 'label'.*--label-field"):
        list(iter_file_documents(tmp_path / "d.csv", CorpusOptions(label_field="label")))
