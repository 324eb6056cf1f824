"""The word-for-word dictionary: IBM Model 1 against a transcription of its EM equations, Dice
against a count by hand, and translation with casing, copying and spacing."""

from __future__ import annotations

from collections import defaultdict

import pytest

from qkv.data.pairs import Pair
from qkv.translation import dictionary
from qkv.translation.dictionary import detokenize, ibm1_table, learn_dictionary, tokenize
from qkv.translation.errors import TranslationError

PAIRS = [("the house is small", "la casa es pequeña"), ("the house is big", "la casa es grande"),
         ("a small book", "un libro pequeño"), ("the book is big", "el libro es grande"),
         ("the house", "la casa"), ("a book", "un libro"),
         ("God said, let there be light.", "Dijo Dios: Sea la luz.")]


def _ibm1_by_the_equations(pairs, iterations):
    """t(f|e) by EM, written out with dictionaries: E-step posteriors over e ∈ {NULL} ∪ source words."""
    sents = [([""] + [w.lower() for w in tokenize(s)], [w.lower() for w in tokenize(t)]) for s, t in pairs]
    t = defaultdict(lambda: 1.0)
    for _ in range(iterations):
        count, total = defaultdict(float), defaultdict(float)
        for es, fs in sents:
            for f in fs:
                z = sum(t[(e, f)] for e in es)
                for e in es:
                    count[(e, f)] += t[(e, f)] / z
                    total[e] += t[(e, f)] / z
        t = defaultdict(float, {(e, f): c / total[e] for (e, f), c in count.items()})
    return dict(t)


@pytest.mark.parametrize("iterations", [1, 3, 8])
def test_ibm1_equals_the_em_equations(iterations, monkeypatch):
    monkeypatch.setattr(dictionary, "_CHUNK", 3)  # several slices, as on a large corpus
    got = ibm1_table(PAIRS, iterations=iterations)
    want = _ibm1_by_the_equations(PAIRS, iterations)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12)


def test_dictionaries_learn_the_obvious_words():
    for method in ("ibm1", "dice"):
        d = learn_dictionary([Pair(s, t) for s, t in PAIRS], method=method)
        assert (d.entries["house"], d.entries["book"], d.entries["a"]) == ("casa", "libro", "un"), method
        assert d.method == method and d.pairs == len(PAIRS) and len(d) == len(d.entries)
        assert all(v[:1].isalnum() for v in d.entries.values()), "a word never translates as punctuation"
        assert "," not in d.entries and d.translate_word(",") == ","


def test_dice_is_the_coefficient_over_pairs():
    d = learn_dictionary(PAIRS, method="dice")
    occurs = [({w.lower() for w in tokenize(s)}, {w.lower() for w in tokenize(t)}) for s, t in PAIRS]

    def dice(e, f):
        both = sum(e in a and f in b for a, b in occurs)
        return 2 * both / (sum(e in a for a, _ in occurs) + sum(f in b for _, b in occurs))

    targets = sorted({f for _, b in occurs for f in b})
    for e in ("small", "big", "book"):
        best = max(targets, key=lambda f, e=e: dice(e, f))
        assert dice(e, d.entries[e]) == pytest.approx(dice(e, best))


def test_translate_keeps_case_copies_unknowns_and_spaces_punctuation():
    d = learn_dictionary(PAIRS)
    assert d.translate("A book, Abraham!") == "Un libro, Abraham!"
    assert d.translate("") == ""
    assert tokenize("¿Dónde está? Moses’ staff") == ["¿", "Dónde", "está", "?", "Moses", "’", "staff"]
    assert detokenize(["¿", "Dónde", "está", "?", "(", "sí", ")", "."]) == "¿Dónde está? (sí)."


@pytest.mark.parametrize("kwargs, message", [
    ({"pairs": []}, "no sentence pairs"),
    ({"pairs": PAIRS, "method": "ibm2"}, "method='ibm2' is not allowed; allowed: ibm1, dice"),
    ({"pairs": PAIRS, "iterations": 0}, "iterations must be a positive integer"),
    ({"pairs": [("", "")]}, "every pair is empty"),
])
def test_bad_input(kwargs, message):
    with pytest.raises(TranslationError, match=message):
        learn_dictionary(**kwargs)
