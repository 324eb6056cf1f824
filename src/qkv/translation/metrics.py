"""Corpus-level translation metrics through sacrebleu: BLEU (Papineni et al., 2002) and chrF
(Popović, 2015), with sacrebleu's defaults — BLEU case-sensitive on its ``13a`` tokenisation with
``exp`` smoothing; chrF with character n-grams up to 6 and β = 2 (chrF2, no word n-grams). Each score
carries sacrebleu's signature string, which pins those settings and the sacrebleu version: two
numbers are comparable exactly when their signatures are equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF

from qkv.translation.errors import TranslationError

__all__ = ["Scores", "bleu", "chrf", "score"]


@dataclass(frozen=True)
class Scores:
    """BLEU and chrF (0–100) of one system on one set of references.

    Attributes:
        bleu: corpus BLEU.
        chrf: corpus chrF2.
        n: the number of segments scored.
        bleu_signature, chrf_signature: sacrebleu's description of the settings.
    """

    bleu: float
    chrf: float
    n: int
    bleu_signature: str
    chrf_signature: str


def _check(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[list[str], list[str]]:
    hyps, refs = list(hypotheses), list(references)
    if len(hyps) != len(refs):
        raise TranslationError(f"{len(hyps)} hypotheses but {len(refs)} references; give one hypothesis per "
                               "reference, in the same order")
    if not hyps:
        raise TranslationError("nothing to score: no hypotheses and no references")
    for name, seq in (("hypothesis", hyps), ("reference", refs)):
        bad = next((i for i, x in enumerate(seq) if not isinstance(x, str)), None)
        if bad is not None:
            raise TranslationError(f"{name} {bad} is a {type(seq[bad]).__name__}, not a string")
    return hyps, refs


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (0–100) of ``hypotheses`` against one reference each."""
    hyps, refs = _check(hypotheses, references)
    return float(BLEU().corpus_score(hyps, [refs]).score)


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus chrF2 (0–100) of ``hypotheses`` against one reference each."""
    hyps, refs = _check(hypotheses, references)
    return float(CHRF().corpus_score(hyps, [refs]).score)


def score(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    """Both metrics and their signatures.

    Raises:
        TranslationError: different numbers of hypotheses and references, none, or a non-string.
    """
    hyps, refs = _check(hypotheses, references)
    b, c = BLEU(), CHRF()
    bleu_score, chrf_score = b.corpus_score(hyps, [refs]).score, c.corpus_score(hyps, [refs]).score
    return Scores(float(bleu_score), float(chrf_score), len(hyps), str(b.get_signature()),
                  str(c.get_signature()))
