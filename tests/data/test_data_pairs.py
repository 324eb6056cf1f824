"""A user's pair files (JSONL, TSV, CSV, gzip) through the record reader, and their one-line errors."""

from __future__ import annotations

import gzip
import json

import pytest

from qkv.data.errors import CorpusDecodeError, CorpusFormatError, CorpusNotFoundError
from qkv.data.pairs import Pair, PairOptions, iter_pair_file


def _write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


def test_jsonl_with_named_fields(tmp_path):
    f = _write(tmp_path / "p.jsonl", json.dumps({"en": " Hello ", "es": "¿Hola?", "id": 3}) + "\n\n"
               + json.dumps({"en": "Good night", "es": "Buenas noches"}) + "\n")
    pairs = list(iter_pair_file(f, PairOptions(source_field="en", target_field="es")))
    assert pairs == [Pair("Hello", "¿Hola?", f"{f}:1"), Pair("Good night", "Buenas noches", f"{f}:3")]
    with pytest.raises(CorpusFormatError,
                       match=r"p\.jsonl:1: no 'source' field \(its fields: 'en', 'es', 'id'\); choose them"):
        list(iter_pair_file(f))


def test_tsv_with_and_without_header(tmp_path):
    f = _write(tmp_path / "h.tsv", "source\ttarget\nHello\tHola\n\"Yes,\" he said\t\"Sí\", dijo\n")
    assert [(p.source, p.target) for p in iter_pair_file(f, PairOptions(quotes="none"))] == [
        ("Hello", "Hola"), ('"Yes," he said', '"Sí", dijo')]
    with pytest.raises(CorpusFormatError, match=r"h\.tsv, line 3: not valid TSV .*"):
        list(iter_pair_file(f))  # strict quoting: a stray quote is an error, never silently dropped
    g = _write(tmp_path / "raw.tsv", "Hello\tHola\nThank you\tGracias\n")
    opts = PairOptions(header=False, quotes="none")
    assert [(p.source, p.target, p.origin) for p in iter_pair_file(g, opts)] == [
        ("Hello", "Hola", f"{g}:1"), ("Thank you", "Gracias", f"{g}:2")]
    with pytest.raises(CorpusFormatError, match="or read a file without a header row with header=False"):
        list(iter_pair_file(g))


def test_csv_quoted_and_gzip(tmp_path):
    f = tmp_path / "p.csv.gz"
    with gzip.open(f, "wt", encoding="utf-8") as fh:
        fh.write('en,es\n"Hello, friend","Hola, amigo"\n"Say ""yes""","Di ""sí"""\n')
    assert [(p.source, p.target) for p in iter_pair_file(f, PairOptions("en", "es"))] == [
        ("Hello, friend", "Hola, amigo"), ('Say "yes"', 'Di "sí"')]


@pytest.mark.parametrize("name, text, options, message", [
    ("bad.tsv", "a\tb\tc\n", {"header": False},
     r"bad\.tsv, line 1: 3 fields, but the file has 2 \(source, target\)"),
    ("bad.tsv", "a\tb\tc\n", {"header": False, "quotes": "none"}, "with quotes='none' a field cannot hold"),
    ("e.tsv", "x\t \n", {"header": False}, r"e\.tsv:1: the target side is empty; .* empty='skip'"),
    ("n.jsonl", '{"source": 1, "target": "x"}\n', {}, "field 'source' must be a string, got int"),
    ("j.jsonl", "[1, 2]\n", {}, "expected a JSON object"),
    ("p.txt", "a\tb\n", {}, r"not a pair file; expected \.jsonl, \.tsv or \.csv"),
])
def test_bad_rows_are_one_line(tmp_path, name, text, options, message):
    f = _write(tmp_path / name, text)
    with pytest.raises(CorpusFormatError, match=message) as e:
        list(iter_pair_file(f, PairOptions(**options)))
    assert "\n" not in str(e.value)


def test_empty_sides_skipped_only_when_asked(tmp_path):
    f = _write(tmp_path / "e.tsv", "a\tb\n\t\nc\t \nd\te\n")
    assert [p.source for p in iter_pair_file(f, PairOptions(header=False, empty="skip"))] == ["a", "d"]


def test_missing_file_bad_utf8_and_bad_options(tmp_path):
    with pytest.raises(CorpusNotFoundError, match="pair file not found"):
        list(iter_pair_file(tmp_path / "none.jsonl"))
    (tmp_path / "b.tsv").write_bytes(b"a\tb\n\xff\tc\n")
    with pytest.raises(CorpusDecodeError, match="line 2: invalid UTF-8"):
        list(iter_pair_file(tmp_path / "b.tsv", PairOptions(header=False)))
    replaced = iter_pair_file(tmp_path / "b.tsv", PairOptions(header=False, encoding_errors="replace"))
    assert [p.source for p in replaced] == ["a", "\ufffd"]
    with pytest.raises(ValueError, match="quotes='single' is not allowed"):
        PairOptions(quotes="single")
    with pytest.raises(ValueError, match="two different names"):
        PairOptions(source_field="x", target_field="x")
