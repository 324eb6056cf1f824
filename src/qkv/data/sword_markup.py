"""Plain verse text from a SWORD module entry: the words kept, the apparatus dropped.

A module's ``SourceType`` names its markup:

* ``OSIS`` (XML): elements keep their words (``<w lemma="strong:H7225">beginning</w>`` →
  ``beginning``; ``<transChange>``, ``<divineName>``, ``<q>``, ``<foreign>``, ``<seg>`` likewise);
  ``<note>`` (footnotes, cross references, Strong's glosses) and heading titles (``<title>`` with a ``type``
  such as ``main``, ``chapter``, ``section``, or a ``level``) are dropped with everything inside them.
  Titles that are printed text are kept: canonical ones (``canonical="true"``: the psalm
  superscriptions), ``type="psalm"`` / ``"acrostic"``, and untyped titles inside a verse (the
  Hebrew letters of Psalm 119, the subscriptions that close the epistles). Attributes (Strong's
  numbers, morphology) are never text.
* ``ThML`` (HTML-like): ``<note>`` dropped with its content, every other tag dropped, words kept.
* ``GBF`` (``<XX…>`` codes): footnotes ``<RF>…<Rf>`` and titles ``<TS>…<Ts>``, ``<TT>…<Tt>`` dropped
  with their content; every other code (Strong's ``<WH1234>``, formatting) dropped, words kept.
* ``Plain``: text as stored.

Then USFM character markers that some imports leave in the text (``\\nd`` before a divine name) and
the paragraph sign ``¶`` are removed, XML entities decoded, and white space collapsed to single
spaces.
"""

from __future__ import annotations

import html
import re

__all__ = ["MARKUPS", "strip_markup"]

MARKUPS = ("OSIS", "ThML", "GBF", "Plain")

# <name attrs> | </name> | <name attrs/>; group 1: "/" of an end tag, 2: name, 3: attributes, 4: "/" empty
_XML_TAG = re.compile(r"<(/?)([A-Za-z][\w:.-]*)((?:[^>\"']|\"[^\"]*\"|'[^']*')*?)(/?)>")
_GBF_TAG = re.compile(r"<([A-Z]{2})[^>]*>|<([A-Z][a-z])>")
_GBF_DROPPED = {"RF": "Rf", "TS": "Ts", "TT": "Tt"}
_SPACE = re.compile(r"\s+")
_USFM = re.compile(r"\\\+?[a-z]+\d*\*?")  # USFM character markers left by some imports: \nd, \+nd*
# Tags that are never dropped and never separate words (their attributes are all they carry): removed
# in one pass before the element-by-element walk, which then sees only the few that matter.
_INLINE = re.compile(r"</?(?:w|transChange|divineName|q|foreign|seg|hi|rdg|reference|catchWord|name)\b"
                     r"(?:[^>\"']|\"[^\"]*\"|'[^']*')*>")
_CANONICAL = re.compile(r"""\bcanonical\s*=\s*["']true["']""")
_TITLE_TYPE = re.compile(r"""\btype\s*=\s*["']([^"']*)["']""")
_LEVEL = re.compile(r"\blevel\s*=")


def _kept_title(attrs: str) -> bool:
    """An OSIS title that is text, not a heading: canonical, a psalm or acrostic title, or untyped."""
    if _CANONICAL.search(attrs):
        return True
    kind = _TITLE_TYPE.search(attrs)
    if kind:
        return kind.group(1).lower() in ("psalm", "acrostic")
    return not _LEVEL.search(attrs)


def _xml_text(raw: str, dropped: frozenset[str]) -> str:
    """The text of ``raw`` outside the elements named in ``dropped`` (OSIS titles: unless canonical)."""
    out: list[str] = []
    skip = 0  # depth inside a dropped element
    pos = 0
    for m in _XML_TAG.finditer(raw):
        if not skip:
            out.append(raw[pos:m.start()])
        pos = m.end()
        end, name, attrs, empty = m.group(1), m.group(2).lower(), m.group(3), m.group(4)
        if empty:  # milestones, line and chapter markers: a word boundary at most
            if not skip:
                out.append(" ")
            continue
        if skip:
            skip += -1 if end else 1
        elif not end and name in dropped and not (name == "title" and _kept_title(attrs)):
            skip = 1
        else:
            out.append(" " if name in ("l", "lg", "p", "div", "lb", "br") else "")
    if not skip:
        out.append(raw[pos:])
    return "".join(out)


def _gbf_text(raw: str) -> str:
    out: list[str] = []
    closing: str | None = None
    pos = 0
    for m in _GBF_TAG.finditer(raw):
        if closing is None:
            out.append(raw[pos:m.start()])
        pos = m.end()
        code = m.group(1) or m.group(2)
        if closing is not None:
            if code == closing:
                closing = None
        elif code in _GBF_DROPPED:
            closing = _GBF_DROPPED[code]
        else:
            out.append(" " if code in ("CM", "CL", "Pp") else "")
    if closing is None:
        out.append(raw[pos:])
    return "".join(out)


def strip_markup(raw: str, markup: str = "OSIS") -> str:
    """The plain text of one entry.

    Args:
        raw: the entry as stored in the module (decoded).
        markup: the module's ``SourceType`` (one of :data:`MARKUPS`, any case).

    Raises:
        ValueError: an unknown markup (the message lists the known ones).
    """
    kind = markup.strip().lower()
    if kind == "osis":
        text = _xml_text(_INLINE.sub("", raw), frozenset({"note", "title"}))
    elif kind == "thml":
        text = _xml_text(raw, frozenset({"note"}))
    elif kind == "gbf":
        text = _gbf_text(raw)
    elif kind == "plain":
        text = raw
    else:
        raise ValueError(f"unknown SWORD markup SourceType={markup!r}; known: {', '.join(MARKUPS)}")
    text = html.unescape(_USFM.sub("", text)).replace("¶", " ")
    return _SPACE.sub(" ", text).strip()
