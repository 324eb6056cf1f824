"""The Bible verse pairs as named datasets: alignment by key, the whole-book split, both directions,
the missing-package message — on modules the tests write, and on the installed Debian packages."""

from __future__ import annotations

import collections

import pytest

import qkv.data.sword
from qkv.data.bible import SPLIT_BOOKS, bible_alignment, bible_pairs, book_split
from qkv.data.corpus import Corpus, train_eval_corpora
from qkv.data.datasets import DATASETS, dataset_fingerprint, dataset_pairs, parse_dataset_spec
from qkv.data.errors import DatasetNotInstalledError, UnknownDatasetError
from qkv.data.versification import book

EN = {
    "Gen.1.1": "In the beginning God created the heaven and the earth.",
    "Gen.1.2": "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "Gen.1.3": "And God said, Let there be light: and there was light.",
    "Gen.1.4": "And God saw the light, that it was good.",
    "Ruth.1.1": "Now it came to pass in the days when the judges ruled, that there was a famine in the land.",
    "Ruth.1.2": "And the name of the man was Elimelech.",
    "Josh.1.1": "Now after the death of Moses the servant of the LORD it came to pass.",
    "Josh.1.2": "Moses my servant is dead; now therefore arise, go over this Jordan.",
    "Heb.13.25": "Grace be with you all. Amen.",
    "Rev.22.21": "The grace of our Lord Jesus Christ be with you all. Amen.",
}
ES = {
    "Gen.1.1": "EN el principio crió Dios los cielos y la tierra.",
    "Gen.1.2": "Y la tierra estaba desordenada y vacía, y las tinieblas sobre la haz del abismo.",
    "Gen.1.3": "Y dijo Dios: Sea la luz: y fué la luz.",
    "Gen.1.4": "Y vió Dios que la luz era buena.",
    "Ruth.1.1": "Y ACONTECIÓ en los días que gobernaban los jueces, que hubo hambre en la tierra.",
    "Ruth.1.2": "El nombre de aquel varón era Elimelech.",
    "Josh.1.1": "Y ACONTECIÓ después de la muerte de Moisés siervo de Jehová.",
    "Josh.1.2": "Mi siervo Moisés es muerto: levántate pues ahora, y pasa este Jordán.",
    "Heb.13.25": "",  # empty in one module: no pair
    "Rev.22.21": "La gracia de nuestro Señor Jesucristo sea con todos vosotros. Amén.",
}


@pytest.fixture
def bible_library(tmp_path, write_sword, monkeypatch):
    """A SWORD library with both modules, found first (``$SWORD_PATH``)."""
    write_sword(tmp_path, "engKJV2006eb", {k: f'<w lemma="strong:H1">{v}</w>' for k, v in EN.items()})
    write_sword(tmp_path, "spaRV1909eb", {k: v for k, v in ES.items() if v})
    monkeypatch.setenv("SWORD_PATH", str(tmp_path))
    return tmp_path


def _key(pair) -> str:
    return pair.origin.rsplit("#", 1)[1]


def test_pairs_by_split_and_direction(bible_library):
    train = bible_pairs("en", "es", "train")
    assert [(_key(p), p.source, p.target) for p in train] == [
        (k, EN[k], ES[k]) for k in ("Gen.1.1", "Gen.1.2", "Gen.1.3", "Gen.1.4", "Rev.22.21")]
    assert train[0].origin == "dataset:bible-en-es:train#Gen.1.1"
    assert [_key(p) for p in bible_pairs("en", "es", "validation")] == ["Ruth.1.1", "Ruth.1.2"]
    test = bible_pairs("es", "en", "test")
    want = [(k, ES[k], EN[k]) for k in ("Josh.1.1", "Josh.1.2")]
    assert [(_key(p), p.source, p.target) for p in test] == want
    assert "Heb.13.25" in {str(k) for k in bible_alignment().empty}


def test_named_datasets(bible_library):
    info, split = parse_dataset_spec("dataset:bible-es-en:test")
    assert (info.languages, split, info.splits) == (("es", "en"), "test", ("train", "validation", "test"))
    assert [p.source for p in dataset_pairs(info, split)] == [ES["Josh.1.1"], ES["Josh.1.2"]]
    docs = list(Corpus("dataset:bible-en-es:validation").documents())
    assert [d.text for d in docs] == [EN["Ruth.1.1"], ES["Ruth.1.1"], EN["Ruth.1.2"], ES["Ruth.1.2"]]
    assert docs[1].source == "dataset:bible-en-es:validation#Ruth.1.1/es"
    held = train_eval_corpora("dataset:bible-en-es")
    assert held.how == "named split: validation" and held.eval.count() == 4
    assert dataset_fingerprint(info, "test") != dataset_fingerprint(info, "train")
    with pytest.raises(UnknownDatasetError, match="'kjv' is not a parallel dataset; parallel datasets: bib"):
        dataset_pairs(DATASETS["kjv"], "all")
    with pytest.raises(UnknownDatasetError, match="has no split 'dev'; its splits: train, validation, test"):
        parse_dataset_spec("dataset:bible-en-es:dev")
    with pytest.raises(ValueError, match="source='fr' is not a language"):
        bible_pairs("fr", "es")


def test_missing_packages_are_one_line_naming_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SWORD_PATH", str(tmp_path))
    monkeypatch.setattr(qkv.data.sword, "_DEFAULT_ROOTS", ())
    with pytest.raises(DatasetNotInstalledError) as e:
        dataset_pairs(*parse_dataset_spec("dataset:bible-en-es"))
    msg = str(e.value)
    assert "\n" not in msg and "engKJV2006eb" in msg and "sword-text-kjv" in msg
    assert "make data" in msg and "sudo apt-get install sword-text-kjv sword-text-sparv" in msg


def test_split_is_by_whole_books():
    assert {book_split(book(o).number) for o in SPLIT_BOOKS["test"]} == {"test"}
    assert {book_split(book(o).number) for o in SPLIT_BOOKS["validation"]} == {"validation"}
    assert not set(SPLIT_BOOKS["test"]) & set(SPLIT_BOOKS["validation"])
    assert {book(o).testament for o in SPLIT_BOOKS["test"]} == {1, 2}
    assert book_split(book("Gen").number) == book_split(book("Matt").number) == "train"


# -- the installed Debian packages -------------------------------------------------------------------

@pytest.fixture(scope="module")
def installed_pairs():
    try:
        return {s: bible_pairs("en", "es", s, roots=["/usr/share/sword"])
                for s in ("train", "validation", "test")}
    except DatasetNotInstalledError:
        pytest.skip("Debian sword-text-kjv / sword-text-sparv not installed; run `make data`")


def test_installed_split_never_shares_a_book(installed_pairs):
    books = {s: {_key(p).split(".")[0] for p in pairs} for s, pairs in installed_pairs.items()}
    assert books["test"] == set(SPLIT_BOOKS["test"])
    assert books["validation"] == set(SPLIT_BOOKS["validation"])
    assert not books["train"] & (books["test"] | books["validation"])
    keys = {s: {_key(p) for p in pairs} for s, pairs in installed_pairs.items()}
    assert not keys["train"] & keys["test"] and not keys["train"] & keys["validation"]
    counts = {s: len(p) for s, p in installed_pairs.items()}
    assert counts == {"train": 28234, "validation": 909, "test": 1751}


def test_installed_pairs_are_aligned(installed_pairs):
    """Known verses pair up; the shifted chapters of the Spanish module are left out."""
    pairs = {_key(p): p for s in installed_pairs.values() for p in s}
    assert pairs["Gen.1.1"].target == "EN el principio crió Dios los cielos y la tierra."
    assert pairs["John.3.16"].source.startswith("For God so loved the world")
    assert pairs["John.3.16"].target.startswith("Porque de tal manera amó Dios al mundo")
    assert "Num.13.5" not in pairs and "Jonah.2.3" not in pairs and "Num.12.15" in pairs
    per_chapter = collections.Counter(k.rsplit(".", 1)[0] for k in pairs)
    assert per_chapter["Gen.1"] == 31 and per_chapter["Rev.22"] == 21
