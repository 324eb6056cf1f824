"""The fenced blocks of README.md and docs/*.md, and how the docs test runs each (support for
tests/test_docs_blocks.py; kept apart so that its parsing is tested on its own).

A block is run as written unless the line just before its opening fence is a marker, visible in the
page's source (an HTML comment, so the rendered page stays clean):

* ``<!-- docs-test: not run — REASON -->``: not run; the reason is reported with the count.
* ``<!-- docs-test: run with "OLD" → "NEW"; "OLD2" → "NEW2" -->``: run after these substitutions
  (the cut-down size of a training command, a fixture folder for a placeholder path).
* ``<!-- docs-test: file PATH -->`` on a data block (a JSON grid, a config): written to PATH in the
  page's folder, for the blocks after it that read that file.

``bash``/``sh`` blocks run line by line (continuation lines joined, comments dropped) in a bash shell;
``python`` blocks run as one script; other blocks (``json``, ``toml``, ``ini``, plain) are data or
synopses and are counted as not run ("not a program").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")
SUBSTITUTION = re.compile(r'"(?P<old>[^"]*)"\s*→\s*"(?P<new>[^"]*)"')
PROGRAMS = {"bash": "shell", "sh": "shell", "python": "python"}


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
    """README.md, every page directly under docs/ and the question pages of docs/experiments/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "experiments").glob("*.md"))]


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
        subs = tuple((m["old"], m["new"]) for m in SUBSTITUTION.finditer(body))
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
        file = parse_file_marker(marker["body"]) if marker else None
        skip, subs = parse_marker(marker["body"]) if marker and not file else (None, ())
        out.append(Block(page, start + 1, language, text, skip, subs, file))
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks_of(p)]


def shell_commands(text: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, blank and comment lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]
