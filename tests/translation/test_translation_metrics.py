"""BLEU and chrF through sacrebleu, checked against the formulas written out here."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from qkv.translation.errors import TranslationError
from qkv.translation.metrics import bleu, chrf, score

HYPS = ["the cat sat on the mat today", "a dog barked at the old postman", "birds sing in spring"]
REFS = ["the cat sat on the red mat", "the dog barked at the postman", "the birds sing in the spring"]


def _ngrams(tokens, n):
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def _bleu(hyps, refs):
    """Papineni et al.: corpus-clipped n-gram precisions (n ≤ 4), geometric mean, brevity penalty."""
    match, total, c, r = [0] * 4, [0] * 4, 0, 0
    for h, ref in zip(hyps, refs):
        h, ref = h.split(), ref.split()
        c, r = c + len(h), r + len(ref)
        for n in range(1, 5):
            hn, rn = _ngrams(h, n), _ngrams(ref, n)
            match[n - 1] += sum(min(k, rn[g]) for g, k in hn.items())
            total[n - 1] += max(len(h) - n + 1, 0)
    bp = 1.0 if c > r else math.exp(1 - r / c)
    return 100 * bp * math.exp(sum(math.log(m / t) for m, t in zip(match, total)) / 4)


def _chrf(hyps, refs, order=6, beta=2.0):
    """Popović: character n-grams (spaces removed), precision and recall averaged over n ≤ 6, F_β."""
    match, hyp_n, ref_n = [0] * order, [0] * order, [0] * order
    for h, ref in zip(hyps, refs):
        h, ref = h.replace(" ", ""), ref.replace(" ", "")
        for n in range(1, order + 1):
            hn, rn = _ngrams(list(h), n), _ngrams(list(ref), n)
            match[n - 1] += sum(min(k, rn[g]) for g, k in hn.items())
            hyp_n[n - 1] += sum(hn.values())
            ref_n[n - 1] += sum(rn.values())
    p = sum(m / h for m, h in zip(match, hyp_n)) / order
    r = sum(m / x for m, x in zip(match, ref_n)) / order
    return 100 * (1 + beta ** 2) * p * r / (beta ** 2 * p + r)


def test_bleu_and_chrf_equal_the_formulas():
    assert bleu(HYPS, REFS) == pytest.approx(_bleu(HYPS, REFS), abs=1e-9)
    assert chrf(HYPS, REFS) == pytest.approx(_chrf(HYPS, REFS), abs=1e-9)
    # the order of the arguments matters (brevity penalty, precision vs recall): swapped differs
    assert bleu(REFS, HYPS) != pytest.approx(bleu(HYPS, REFS))


def test_score_carries_both_and_signatures():
    s = score(HYPS, REFS)
    assert (s.bleu, s.chrf, s.n) == (pytest.approx(bleu(HYPS, REFS)), pytest.approx(chrf(HYPS, REFS)), 3)
    assert "tok:13a" in s.bleu_signature and "nc:6" in s.chrf_signature
    perfect = score(REFS, REFS)
    assert perfect.bleu == pytest.approx(100) and perfect.chrf == pytest.approx(100)
    assert score(["¿Dónde está?"], ["¿Dónde está?"]).chrf == pytest.approx(100)


@pytest.mark.parametrize("hyps, refs, message", [
    (["a"], ["a", "b"], "1 hypotheses but 2 references"),
    ([], [], "nothing to score"),
    (["a", None], ["a", "b"], "hypothesis 1 is a NoneType, not a string"),
])
def test_bad_input_is_one_line(hyps, refs, message):
    with pytest.raises(TranslationError, match=message):
        score(hyps, refs)
