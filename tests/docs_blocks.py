"""The fenced blocks of README.md and docs/*.md, and how the docs test runs each (support for
tests/test_docs_blocks.py; kept apart so that its parsing is tested on its own).

A block is run as written unless the line just before its opening fence is a marker, visible in the
page's source (an HTML comment, so the rendered page stays clean):

* ``<!-- docs-test: not run — REASON -->``: not run; the reason is reported with the count.
* ``<!-- docs-test: run with "OLD" → "NEW"; "OLD2" → "NEW2" -->``: run after these substitutions
  (the cut-down size of a training command, a fixture folder for a placeholder path); a quote inside
  OLD or NEW is written ``\\"``.
* ``<!-- docs-test: file PATH -->`` on a data block (a JSON grid, a config): written to PATH in the
  page's folder, for the blocks after it that read that file.
* ``<!-- docs-test: needs PKG, PKG2 -->`` (alone, or before ``; run with …``): the block needs these
  packages (Debian or PyPI names the test knows how to look for); where one is missing the block is
  skipped and the skip names it.

Every page is either in :data:`RUN` or in :data:`EXCLUDED` with the reason; ``python
tests/docs_blocks.py --summary`` lists every block of every page and what the test does with it.

``bash``/``sh`` blocks run line by line (continuation lines joined, comments dropped) in a bash shell;
``python`` blocks run as one script; other blocks (``json``, ``toml``, ``ini``, plain) are data or
synopses and are counted as not run ("not a program").
"""

from __future__ import annotations

import fnmatch
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")
SUBSTITUTION = re.compile(r'"(?P<old>(?:[^"\\]|\\.)*)"\s*→\s*"(?P<new>(?:[^"\\]|\\.)*)"')
PROGRAMS = {"bash": "shell", "sh": "shell", "python": "python"}

#: the pages whose every block is run, marked not run, or (a data block) written or counted
RUN = ("README.md", "docs/analysis.md", "docs/architecture.md", "docs/attention.md", "docs/benchmarks.md", "docs/data.md",
       "docs/decoder.md", "docs/demo.md", "docs/deployment.md", "docs/embeddings.md", "docs/experiments.md",
       "docs/finetuning.md", "docs/generation.md", "docs/inference.md", "docs/interpretability.md", "docs/models.md",
       "docs/plugins.md", "docs/positions.md", "docs/pretraining.md", "docs/reliability.md", "docs/scaling.md",
       "docs/seq2seq.md", "docs/serving.md", "docs/translation.md", "docs/vision.md",
       "docs/experiments/heads.md", "docs/experiments/method.md", "docs/experiments/norm.md",
       "docs/experiments/positions.md", "docs/experiments/projections.md", "docs/experiments/scaling.md",
       "docs/experiments/similarity.md")

#: pages left out of the run, each with its reason (a pattern over the page's path); such a page may hold no
#: program block (the test checks it), so nothing a reader could run escapes the test
EXCLUDED = {
    "docs/analysis/*/report.md": "a report `qkv analyze` wrote (its output, kept as evidence): no commands",
    "docs/interpretability/findings/*/*.md": "a report `qkv findings` wrote (its output, kept as evidence): no commands",
}


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text, and what its marker says."""

    page: str
    line: int
    language: str
    text: str
    skip: str | None = None  # the reason it is not run
    substitutions: tuple[tuple[str, str], ...] = ()
    file: str | None = None  # a data block written to this path for the blocks after it
    needs: tuple[str, ...] = ()  # packages the block needs: skipped, naming them, where one is missing

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def kind(self) -> str | None:
        """``shell``, ``python``, or ``None`` for a block that is not a program."""
        return PROGRAMS.get(self.language)

    def source(self) -> str:
        """The text to run: the block with its marked substitutions applied (each must occur)."""
        text = self.text
        for old, new in self.substitutions:
            if old not in text:
                raise ValueError(f"{self.name}: marked substitution {old!r} does not occur in the block")
            text = text.replace(old, new)
        return text


def pages() -> list[Path]:
    """README.md and every page under docs/, at any depth."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def exclusion(page: str) -> str | None:
    """The reason ``page`` (a path relative to the repository) is left out of the run, else ``None``."""
    return next((why for pattern, why in EXCLUDED.items() if fnmatch.fnmatchcase(page, pattern)), None)


def parse_needs(body: str) -> tuple[tuple[str, ...], str]:
    """``(packages, rest of the body)`` of a marker that starts with ``needs PKG, PKG2``; ``((), body)``
    for one that does not.

    Raises:
        ValueError: ``needs`` without a package.
    """
    if not body.startswith("needs"):
        return (), body
    head, _, rest = body.partition(";")
    names = tuple(n for n in re.split(r"[,\s]+", head[len("needs"):]) if n)
    if not names:
        raise ValueError(f"marker {body!r}: name the packages the block needs")
    return names, rest.strip()


def parse_file_marker(body: str) -> str | None:
    """The relative path of a ``file PATH`` marker's body, else ``None``.

    Raises:
        ValueError: a path that is absolute or climbs out of the page's folder.
    """
    if not body.startswith("file "):
        return None
    path = body[len("file "):].strip()
    if not path or path.startswith("/") or ".." in Path(path).parts:
        raise ValueError(f"marker {body!r}: give a relative path inside the page's folder")
    return path


def _unescape(text: str) -> str:
    """A substitution's text with ``\\"`` read as a quote and ``\\\\`` as a backslash."""
    return re.sub(r"\\(.)", r"\1", text)


def parse_marker(body: str) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """``(skip reason, substitutions)`` of a marker's body (see the module docstring).

    Raises:
        ValueError: a marker that is none of the forms, or a skip without a reason.
    """
    if body.startswith("not run"):
        reason = body[len("not run"):].lstrip(" —-:").strip()
        if not reason:
            raise ValueError(f"marker {body!r}: say why the block is not run")
        return reason, ()
    if body.startswith("run with"):
        subs = tuple((_unescape(m["old"]), _unescape(m["new"])) for m in SUBSTITUTION.finditer(body))
        if not subs:
            raise ValueError(f"marker {body!r}: no \"OLD\" → \"NEW\" substitution")
        return None, subs
    raise ValueError(f"marker {body!r}: expected 'not run — REASON' or 'run with \"OLD\" → \"NEW\"'")


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of one page, with their markers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    page = str(path.relative_to(ROOT))
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, language, start = m[1], m[2], i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        text = "\n".join(x[len(indent):] if x.startswith(indent) else x for x in lines[i + 1:j]) + "\n"
        prev = lines[start - 1].strip() if start > 0 else ""
        marker = MARKER.match(prev)
        needs, body = parse_needs(marker["body"]) if marker else ((), "")
        file = parse_file_marker(body) if marker else None
        skip, subs = parse_marker(body) if body and not file else (None, ())
        if needs and skip:
            raise ValueError(f"{page}:{start + 1}: a block marked not run needs no packages")
        out.append(Block(page, start + 1, language, text, skip, subs, file, needs))
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks_of(p)]


def shell_commands(text: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, blank and comment lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def status(block: Block) -> str:
    """What the docs test does with a block, in words."""
    if exclusion(block.page):
        return f"excluded page: {exclusion(block.page)}"
    if block.page not in RUN:
        return "NOT COVERED: the page is neither run nor excluded"
    if block.file:
        return f"written to {block.file}"
    if not block.kind:
        return f"not a program ({block.language or 'plain'} block)"
    if block.skip:
        return f"not run: {block.skip}"
    how = f"run with {len(block.substitutions)} substitution(s)" if block.substitutions else "run as written"
    return how + (f", needs {', '.join(block.needs)}" if block.needs else "")


def summary() -> str:
    """Every block of every page and its status (nothing is run), then the totals."""
    lines, totals = [], {}
    for page in pages():
        blocks = blocks_of(page)
        lines.append(f"{page.relative_to(ROOT)}: {len(blocks)} blocks")
        for b in blocks:
            what = status(b)
            key = "run" if what.startswith("run") else what.split(":")[0].split(" (")[0]
            totals[key] = totals.get(key, 0) + 1
            first = b.text.strip().splitlines()[0][:70] if b.text.strip() else ""
            lines.append(f"  line {b.line:>4} [{what}]  {first}")
    lines.append("totals: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    return "\n".join(lines)


if __name__ == "__main__":  # python tests/docs_blocks.py --summary
    if sys.argv[1:] != ["--summary"]:
        sys.exit("usage: python tests/docs_blocks.py --summary")
    print(summary())
