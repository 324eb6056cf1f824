"""Translation: scores and baselines for English–Spanish (and any other pairs).

:mod:`.metrics` (BLEU and chrF through sacrebleu), :mod:`.dictionary` (a word-for-word dictionary
learned from sentence pairs: IBM Model 1 or Dice), :mod:`.apertium` (Debian's rule-based
translator as a baseline), :mod:`.baselines` (:func:`score_baselines`: copy, dictionary and
Apertium on the held-out books of ``dataset:bible-en-es`` / ``bible-es-en``). See docs/translation.md.

Import each name from the module that defines it."""
