"""Apertium, a rule-based translator that runs offline, as a baseline (Debian ``apertium-eng-spa``).

``apertium -u eng-spa`` reads text on standard input and writes its translation; ``-u`` leaves
unknown words unmarked (no ``*``). One call translates a whole list, one line per text: texts are
joined by newlines, and the output must have as many lines.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence

from qkv.translation.errors import TranslationError

__all__ = ["APERTIUM_MODES", "APERTIUM_PACKAGE", "apertium_missing", "apertium_translate"]

APERTIUM_MODES = {("en", "es"): "eng-spa", ("es", "en"): "spa-eng"}
APERTIUM_PACKAGE = "apertium-eng-spa"
_SPACE = re.compile(r"\s+")


def _mode(source: str, target: str) -> str:
    mode = APERTIUM_MODES.get((source, target))
    if mode is None:
        known = ", ".join(f"{s}-{t}" for s, t in APERTIUM_MODES)
        raise TranslationError(f"no Apertium baseline for {source}-{target}; known directions: {known}")
    return mode


def apertium_missing(source: str, target: str) -> str | None:
    """``None`` when Apertium can translate ``source`` → ``target`` here, else the reason (one line
    naming the install command)."""
    mode = _mode(source, target)
    install = f"install it with `make data` (as root) or `sudo apt-get install {APERTIUM_PACKAGE}`"
    if shutil.which("apertium") is None:
        return f"apertium is not installed; {install}"
    try:
        done = subprocess.run(["apertium", "-l"], capture_output=True, text=True, timeout=60, check=False)
        listed = done.stdout.split()
    except (OSError, subprocess.SubprocessError) as e:
        return f"apertium -l failed ({e}); reinstall it: sudo apt-get install --reinstall {APERTIUM_PACKAGE}"
    if mode not in listed:
        return f"apertium has no {mode} mode; {install}"
    return None


def apertium_translate(texts: Sequence[str], source: str, target: str, *, timeout: float = 1800) -> list[str]:
    """Translate ``texts`` (one output per text, white space collapsed) in one Apertium call.

    Raises:
        TranslationError: Apertium missing, failing, timing out, or returning another number of lines.
    """
    missing = apertium_missing(source, target)
    if missing:
        raise TranslationError(missing)
    lines = [_SPACE.sub(" ", t).strip() for t in texts]
    try:
        done = subprocess.run(["apertium", "-u", _mode(source, target)], input="\n".join(lines) + "\n",
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise TranslationError(f"apertium took more than {timeout:g} s for {len(lines)} lines; "
                               "translate fewer lines per call") from None
    if done.returncode != 0:
        err = " ".join(done.stderr.split())[:300]
        raise TranslationError(f"apertium {_mode(source, target)} failed (exit {done.returncode}): {err}")
    out = done.stdout.split("\n")
    if out and out[-1] == "":
        out.pop()
    if len(out) != len(lines):
        raise TranslationError(f"apertium returned {len(out)} lines for {len(lines)} inputs; "
                               "the outputs cannot be matched to their sources")
    return [_SPACE.sub(" ", o).strip() for o in out]
