"""Score a trained translation model against the baselines on the held-out books, in one run.

:func:`evaluate_translation` translates every pair of a split (greedy and beam search), scores
each with BLEU and chrF, runs the baselines of :mod:`qkv.translation.baselines` on the same pairs
in the same process, and returns a :class:`TranslationReport` with the table, timings and sample
translations (the best- and worst-scored verses by sentence chrF). ``write_report`` saves it as
JSON (``report.json``) and Markdown (``report.md``) in a folder, atomically.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sacrebleu.metrics import CHRF

from qkv._fs import atomic_write_text
from qkv.data.bible import bible_pairs
from qkv.translation.baselines import BaselineReport, parse_direction, score_baselines
from qkv.translation.metrics import Scores, score
from qkv.translation.translate import translate

__all__ = ["SystemScore", "TranslationReport", "evaluate_translation", "write_report"]


@dataclass(frozen=True)
class SystemScore:
    """One system on the held-out pairs: BLEU, chrF, seconds, a note."""

    name: str
    bleu: float | None
    chrf: float | None
    seconds: float
    note: str = ""


@dataclass
class TranslationReport:
    """Model and baselines on one split; ``samples``: ``{origin, source, reference, model}`` rows."""

    direction: str
    split: str
    pairs: int
    rows: list[SystemScore]
    samples: dict[str, list[dict]] = field(default_factory=dict)

    def table(self) -> str:
        """A Markdown table of every system."""
        lines = [f"{self.direction}, {self.split} ({self.pairs} pairs)", "",
                 "| system | BLEU | chrF | seconds | note |", "|---|---:|---:|---:|---|"]
        for r in self.rows:
            b = "—" if r.bleu is None else f"{r.bleu:.2f}"
            c = "—" if r.chrf is None else f"{r.chrf:.2f}"
            lines.append(f"| {r.name} | {b} | {c} | {r.seconds:.1f} | {r.note} |")
        return "\n".join(lines)


def _row(name: str, s: Scores | None, seconds: float, note: str = "") -> SystemScore:
    return SystemScore(name, None if s is None else round(s.bleu, 2), None if s is None else round(s.chrf, 2),
                       round(seconds, 1), note)


def _samples(pairs, hyps: list[str], n: int) -> dict[str, list[dict]]:
    metric = CHRF()
    ranked = sorted(range(len(pairs)), key=lambda i: metric.sentence_score(hyps[i], [pairs[i].target]).score)
    row = lambda i: {"origin": pairs[i].origin, "source": pairs[i].source, "reference": pairs[i].target,  # noqa: E731
                     "model": hyps[i]}
    return {"best": [row(i) for i in ranked[::-1][:n]], "worst": [row(i) for i in ranked[:n]],
            "first": [row(i) for i in range(min(n, len(pairs)))]}


def evaluate_translation(model, tokenizer, direction: str = "en-es", *, split: str = "test",
                         pairs: Sequence | None = None, beams: Sequence[int] = (1, 4), batch_size: int = 32,
                         baselines: bool = True, samples: int = 5) -> TranslationReport:
    """Model (one row per beam size) and baselines on ``split`` of the Bible pairs (or ``pairs``).

    A verse longer than the model's window is scored as a copy of its source (counted in the note).

    Raises:
        TranslationError: a bad direction, no pairs. DatasetNotInstalledError: no Bible packages.
    """
    source, target = parse_direction(direction)
    held = list(pairs) if pairs is not None else bible_pairs(source, target, split)
    refs = [p.target for p in held]
    window = model.encoder.max_len
    long = sum(len(tokenizer.encode(p.source).ids) + 1 > window for p in held)
    rows, report_samples = [], {}
    for k in beams:
        t0 = time.perf_counter()
        hyps = translate(model, tokenizer, [p.source for p in held], beams=k, batch_size=batch_size,
                         too_long="copy")
        name = "model, greedy" if k == 1 else f"model, beam {k}"
        note = f"{long} verses longer than the window copied" if long else ""
        rows.append(_row(name, score(hyps, refs), time.perf_counter() - t0, note))
        report_samples = _samples(held, hyps, samples)  # of the last (widest) beam
    if baselines:
        base: BaselineReport = score_baselines(direction, split=split, held_out=None if pairs is None else held)
        rows += [_row(b.name, b.scores, b.seconds, b.note) for b in base.rows]
    return TranslationReport(direction, split if pairs is None else "given pairs", len(held), rows, report_samples)


def write_report(report: TranslationReport, folder: str | Path, extra: dict | None = None) -> Path:
    """``report.json`` and ``report.md`` in ``folder`` (created if needed); returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = {**asdict(report), **(extra or {})}
    atomic_write_text(folder / "report.json", json.dumps(data, indent=2, ensure_ascii=False))
    md = [report.table(), ""]
    for kind, rows in report.samples.items():
        md += [f"## {kind}", ""]
        for r in rows:
            md += [f"- **{r['origin']}**", f"  - source: {r['source']}", f"  - reference: {r['reference']}",
                   f"  - model: {r['model']}"]
        md.append("")
    atomic_write_text(folder / "report.md", "\n".join(md))
    return folder
