"""Translation: scores and baselines for English–Spanish (and any other pairs).

:mod:`.metrics` (BLEU and chrF through sacrebleu), :mod:`.dictionary` (a word-for-word dictionary
learned from sentence pairs: IBM Model 1 or Dice), :mod:`.apertium` (Debian's rule-based
translator as a baseline), :mod:`.baselines` (:func:`score_baselines`: copy, dictionary and
Apertium on the held-out books of ``dataset:bible-en-es`` / ``bible-es-en``). See docs/translation.md.
"""

from __future__ import annotations

from qkv.translation.baselines import BaselineReport, score_baselines
from qkv.translation.errors import TranslationError
from qkv.translation.metrics import Scores, bleu, chrf, score

__all__ = ["score_baselines", "BaselineReport", "Scores", "bleu", "chrf", "score", "TranslationError"]
