"""Shared fixtures of the data-pipeline tests: a small tokenizer and token cache on real text
(``dataset:pydoc``, always installed), built once per session; SWORD modules written by the tests."""

from __future__ import annotations

import bz2
import lzma
import struct
import zlib
from pathlib import Path

import pytest

from qkv.data.cache import build_token_cache
from qkv.data.corpus import Corpus
from qkv.data.tokenizer import train_tokenizer
from qkv.data.versification import KJV_BOOKS, book

VOCAB = 997  # distinct from every other size in the tests


@pytest.fixture(scope="session")
def pydoc_tokenizer():
    return train_tokenizer(Corpus("dataset:pydoc"), vocab_size=VOCAB)


@pytest.fixture(scope="session")
def pydoc_cache(pydoc_tokenizer, tmp_path_factory):
    return build_token_cache(Corpus("dataset:pydoc"), pydoc_tokenizer, tmp_path_factory.mktemp("cache"))


# -- SWORD modules written by the tests ------------------------------------------------------------
# A zText module as the SWORD tools lay it out (see qkv.data.sword): mods.d/<name>.conf and, per
# testament, a block index (.?zs), a verse index (.?zv) and the compressed blocks (.?zz). The entry of
# a verse is computed here by arithmetic over the book table, independently of the reader's walk.

_COMPRESS = {"ZIP": zlib.compress, "BZIP2": bz2.compress, "XZ": lzma.compress}


def sword_entry(osis: str, chapter: int, verse: int) -> tuple[int, int]:
    """(testament, verse-index entry) of a verse: 2 headings, then per book 1 + per chapter 1 + verses."""
    b = book(osis)
    before = [x for x in KJV_BOOKS if x.testament == b.testament and x.number < b.number]
    entry = 2 + sum(1 + len(x.chapters) + sum(x.chapters) for x in before)
    entry += 1 + sum(1 + n for n in b.chapters[:chapter - 1]) + 1 + (verse - 1)
    return b.testament, entry


def write_sword_module(root: Path, name: str, verses: dict[str, str], *, markup: str = "OSIS",
                       compression: str = "ZIP", block_type: str = "BOOK", driver: str = "zText",
                       encoding: str = "UTF-8", conf_extra: str = "", conf_name: str | None = None) -> Path:
    """Write module ``name`` holding ``verses`` ({"Gen.1.1": raw entry text}) into library ``root``;
    returns the conf path. ``conf_extra`` lines are appended to the configuration."""
    data = root / "modules" / "texts" / "ztext" / name.lower()
    data.mkdir(parents=True, exist_ok=True)
    (root / "mods.d").mkdir(parents=True, exist_ok=True)
    letter = {"BOOK": "b", "CHAPTER": "c", "VERSE": "v"}[block_type]
    size_fmt = "<IIH" if driver == "zText" else "<III"
    n_entries = {1: 24115, 2: 8246}
    for testament, prefix in ((1, "ot"), (2, "nt")):
        blocks: dict[tuple, list[tuple[int, bytes]]] = {}
        for ref, text in verses.items():
            osis, chapter, verse = ref.rsplit(".", 2)
            t, entry = sword_entry(osis, int(chapter), int(verse))
            if t != testament:
                continue
            group = {"BOOK": (osis,), "CHAPTER": (osis, chapter), "VERSE": (ref,)}[block_type]
            raw = text.encode("utf-8" if encoding == "UTF-8" else "latin-1")
            blocks.setdefault(group, []).append((entry, raw))
        index = bytearray(struct.calcsize(size_fmt) * n_entries[testament])
        bzs, bzz = bytearray(), bytearray()
        for number, (_, items) in enumerate(sorted(blocks.items(), key=lambda kv: min(e for e, _ in kv[1]))):
            raw = bytearray()
            for entry, text in sorted(items):
                at = entry * struct.calcsize(size_fmt)
                struct.pack_into(size_fmt, index, at, number, len(raw), len(text))
                raw += text
            packed = _COMPRESS[compression](bytes(raw))
            bzs += struct.pack("<III", len(bzz), len(packed), len(raw))
            bzz += packed
        (data / f"{prefix}.{letter}zs").write_bytes(bytes(bzs))
        (data / f"{prefix}.{letter}zv").write_bytes(bytes(index))
        (data / f"{prefix}.{letter}zz").write_bytes(bytes(bzz))
    conf = root / "mods.d" / f"{conf_name or name.lower()}.conf"
    conf.write_text(
        f"## written by the tests\n[{name}]\nDescription=test module {name}\n"
        f"DataPath=./modules/texts/ztext/{name.lower()}/\nModDrv={driver}\nSourceType={markup}\n"
        f"Encoding={encoding}\nCompressType={compression}\nBlockType={block_type}\nVersification=KJV\n"
        f"{conf_extra}", encoding="utf-8")
    return conf


@pytest.fixture
def write_sword():
    """:func:`write_sword_module` (``write_sword(root, name, verses, **options)``)."""
    return write_sword_module


@pytest.fixture
def sword_entry_of():
    """:func:`sword_entry`: (testament, verse-index entry) of ``("Gen", 1, 1)``."""
    return sword_entry
