"""The baselines: copy, dictionary, Apertium (a stand-in script here; the real one when installed)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from qkv.translation.apertium import apertium_missing, apertium_translate
from qkv.translation.baselines import parse_direction, score_baselines
from qkv.translation.errors import TranslationError
from qkv.translation.metrics import score

TRAIN = [("the house is small", "la casa es pequeña"), ("the house is big", "la casa es grande"),
         ("a small book", "un libro pequeño"), ("the book is big", "el libro es grande"),
         ("a house", "una casa"), ("a book", "un libro")]
HELD = [("a big house", "una casa grande"), ("the small book", "el libro pequeño")]

FAKE = """#!/bin/sh
# stands in for apertium: -l lists the modes; a translation upper-cases its input ($FAKE_LINES: drop one)
case "$1" in -l) echo eng-spa; echo spa-eng; exit 0;; esac
[ -n "$FAKE_FAIL" ] && { echo "no such mode" >&2; exit 3; }
if [ -n "$FAKE_LINES" ]; then tr a-z A-Z | sed 1d; else tr a-z A-Z; fi
"""


@pytest.fixture
def fake_apertium(tmp_path, monkeypatch):
    script = tmp_path / "apertium"
    script.write_text(FAKE)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    return script


def test_score_baselines_on_given_pairs(fake_apertium):
    report = score_baselines("en-es", train=TRAIN, held_out=HELD)
    names = [r.name for r in report.rows]
    assert names == ["copy", "dictionary (ibm1)", "apertium"]
    copy, dictionary, apertium = report.rows
    assert copy.scores == score([s for s, _ in HELD], [t for _, t in HELD])
    assert dictionary.scores.chrf > copy.scores.chrf
    assert apertium.scores == score(["A BIG HOUSE", "THE SMALL BOOK"], [t for _, t in HELD])
    assert (report.pairs, report.train_pairs, report.split, report.books) == (2, 6, "given pairs", ())
    table = report.table()
    assert "| copy |" in table and "| apertium |" in table and "en-es, given pairs (2 pairs" in table


def test_apertium_missing_is_a_note_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    report = score_baselines("es-en", train=[(t, s) for s, t in TRAIN], held_out=[(t, s) for s, t in HELD],
                             method="dice")
    row = report.rows[-1]
    assert row.scores is None and row.note.startswith("skipped: apertium is not installed")
    assert "make data" in row.note and "apt-get install apertium-eng-spa" in row.note
    assert "| apertium | — | — |" in report.table()
    without = score_baselines("en-es", train=TRAIN, held_out=HELD, apertium=False)
    assert without.rows[-1].name == "dictionary (ibm1)"


def test_apertium_failures_are_one_line(fake_apertium, monkeypatch):
    assert apertium_missing("en", "es") is None
    assert apertium_translate(["a b", "c\nd"], "es", "en") == ["A B", "C D"]
    monkeypatch.setenv("FAKE_LINES", "1")
    with pytest.raises(TranslationError, match="returned 1 lines for 2 inputs"):
        apertium_translate(["a", "b"], "en", "es")
    monkeypatch.delenv("FAKE_LINES")
    monkeypatch.setenv("FAKE_FAIL", "1")
    with pytest.raises(TranslationError, match=r"apertium eng-spa failed \(exit 3\): no such mode"):
        apertium_translate(["a"], "en", "es")
    with pytest.raises(TranslationError, match="no Apertium baseline for en-fr; known directions: en-es"):
        apertium_missing("en", "fr")


@pytest.mark.parametrize("call, message", [
    (lambda: parse_direction("en_es"), "must be SOURCE-TARGET"),
    (lambda: parse_direction("en-en"), "must be SOURCE-TARGET"),
    (lambda: score_baselines("en-es", split="train"), "would score the baselines on the pairs"),
    (lambda: score_baselines("en-es", train=TRAIN, held_out=[]), "no pairs to score"),
])
def test_bad_requests(call, message):
    with pytest.raises(TranslationError, match=message):
        call()


def test_real_apertium_translates():
    if shutil.which("apertium") is None or apertium_missing("en", "es"):
        pytest.skip("Debian apertium-eng-spa not installed; run `make data`")
    out = apertium_translate(["The house is small.", "In the beginning God created the heaven."], "en", "es")
    assert out[0] == "La casa es pequeña." and "Dios" in out[1]
    assert subprocess.run(["apertium", "-l"], capture_output=True, text=True, check=False).returncode == 0


@pytest.mark.slow
def test_bible_baselines_on_the_test_books():
    """The whole measurement of docs/translation.md for one direction (about a minute)."""
    from qkv.data.errors import DatasetNotInstalledError

    try:
        report = score_baselines("en-es")
    except DatasetNotInstalledError:
        pytest.skip("Debian sword-text-kjv / sword-text-sparv not installed; run `make data`")
    copy, dictionary = report.rows[:2]
    assert report.pairs == 1751 and report.books == ("Josh", "Dan", "Rom", "Heb")
    assert copy.scores.bleu < 1 and dictionary.scores.bleu > 12 and dictionary.scores.chrf > 40
