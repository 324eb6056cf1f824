"""A reader of SWORD Bible modules in the zText format (what Debian's ``sword-text-*`` packages ship).

A SWORD *library* is a folder with ``mods.d/*.conf`` (one configuration file per module) and the
modules' data under the ``DataPath`` each configuration names, relative to the library folder. The
libraries searched, in order: ``$SWORD_PATH``, ``~/.sword``, ``/usr/share/sword``,
``/usr/local/share/sword``.

A configuration is an INI-like file: ``[ModuleName]`` and then ``Key=Value`` lines (a key may repeat;
lines starting with ``#`` are comments; a value ending in ``\\`` continues on the next line). This
reader uses ``DataPath``, ``ModDrv`` (``zText``; ``zText4``), ``SourceType`` (markup: OSIS, ThML,
GBF, Plain — :mod:`qkv.data.sword_markup`), ``Encoding`` (UTF-8; SWORD's default Latin-1),
``CompressType`` (ZIP = zlib; also BZIP2 and XZ), ``BlockType`` (BOOK, CHAPTER or VERSE: how much
text one compressed block holds), ``Versification`` (``KJV``, the default, is the one supported —
:mod:`qkv.data.versification`) and ``CipherKey`` (enciphered modules are refused).

The data of each testament (``ot``, ``nt``) is three files, all integers little-endian; ``b`` in
the names is the block type's letter (``b`` BOOK, ``c`` CHAPTER, ``v`` VERSE):

* ``ot.bzs`` — the block index: per block, 12 bytes ``(offset u32, compressed size u32,
  uncompressed size u32)`` locating it in ``ot.bzz``;
* ``ot.bzz`` — the compressed blocks, one after the other;
* ``ot.bzv`` — the verse index: per entry (see :mod:`qkv.data.versification` for which verse each
  entry is), 10 bytes ``(block u32, start u32, size u16)`` — the entry's bytes are
  ``block[start:start + size]`` once the block is decompressed (``zText4``: a u32 size, 12 bytes).
  A size of 0 is an empty entry.
"""

from __future__ import annotations

import bz2
import lzma
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qkv.data.errors import CorpusDecodeError, CorpusFormatError, CorpusNotFoundError
from qkv.data.sword_markup import MARKUPS, strip_markup
from qkv.data.versification import KJV_BOOKS, VerseKey, book, index_size, verse_entries

__all__ = ["SwordConf", "SwordModule", "Verse", "read_conf", "find_module", "open_module", "sword_roots",
           "BLOCK_LETTERS", "VERSE_INDEX_DTYPES", "BLOCK_INDEX_DTYPE"]

BLOCK_LETTERS = {"BOOK": "b", "CHAPTER": "c", "VERSE": "v"}
BLOCK_INDEX_DTYPE = np.dtype([("offset", "<u4"), ("csize", "<u4"), ("usize", "<u4")])
VERSE_INDEX_DTYPES = {
    "ztext": np.dtype([("block", "<u4"), ("start", "<u4"), ("size", "<u2")]),
    "ztext4": np.dtype([("block", "<u4"), ("start", "<u4"), ("size", "<u4")]),
}
_DECOMPRESS = {"ZIP": zlib.decompress, "BZIP2": bz2.decompress, "XZ": lzma.decompress}
_DEFAULT_ROOTS = ("~/.sword", "/usr/share/sword", "/usr/local/share/sword")


@dataclass(frozen=True)
class SwordConf:
    """What a module's ``mods.d`` configuration says (SWORD's defaults where a key is absent)."""

    name: str
    conf_path: Path
    data_path: Path  # absolute
    driver: str = "zText"
    markup: str = "Plain"
    encoding: str = "Latin-1"
    compression: str = "LZSS"
    block_type: str = "CHAPTER"
    versification: str = "KJV"
    enciphered: bool = False
    lang: str = ""
    description: str = ""


@dataclass(frozen=True)
class Verse:
    """One verse: its key and its plain text (``""`` for an empty entry)."""

    key: VerseKey
    text: str


def _conf_values(path: Path) -> tuple[str, dict[str, str]]:
    try:
        lines = path.read_bytes().decode("utf-8", "replace").splitlines()
    except OSError as e:
        raise CorpusNotFoundError(f"cannot read SWORD configuration {path}: {e.strerror}") from None
    name, values, pending = "", {}, ""
    for line in lines:
        line = pending + line
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        pending, line = "", line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]") and not name:
            name = line[1:-1].strip()
        elif "=" in line and name:
            key, _, value = line.partition("=")
            values.setdefault(key.strip().lower(), value.strip())
    if not name:
        raise CorpusFormatError(f"{path}: not a SWORD module configuration (no [ModuleName] line)")
    return name, values


def read_conf(path: str | os.PathLike) -> SwordConf:
    """Parse one ``mods.d/*.conf`` file; ``DataPath`` is resolved against the library folder (the
    parent of ``mods.d``).

    Raises:
        CorpusNotFoundError: the file cannot be read.
        CorpusFormatError: no ``[ModuleName]`` line or no ``DataPath``.
    """
    path = Path(path)
    name, v = _conf_values(path)
    if not v.get("datapath"):
        raise CorpusFormatError(f"{path}: module [{name}] has no DataPath=")
    root = path.parent.parent
    return SwordConf(
        name, path, (root / v["datapath"]).resolve(), v.get("moddrv", "zText"), v.get("sourcetype", "Plain"),
        v.get("encoding", "Latin-1"), v.get("compresstype", "LZSS").upper(),
        v.get("blocktype", "CHAPTER").upper(), v.get("versification", "KJV"), bool(v.get("cipherkey")),
        v.get("lang", ""), v.get("description", ""))


def sword_roots() -> list[Path]:
    """The SWORD library folders searched, in order (``$SWORD_PATH`` first when set)."""
    env = os.environ.get("SWORD_PATH")
    roots = [Path(p).expanduser() for p in (env.split(os.pathsep) if env else []) if p]
    return roots + [Path(p).expanduser() for p in _DEFAULT_ROOTS]


def find_module(name: str, roots: Sequence[str | os.PathLike] | None = None) -> SwordConf:
    """The configuration of the module called ``name`` (any case) in the first library that has it.

    Raises:
        CorpusNotFoundError: no library has it (the message lists the folders searched).
    """
    folders = [Path(r) for r in roots] if roots is not None else sword_roots()
    for root in folders:
        mods = root / "mods.d"
        if not mods.is_dir():
            continue
        for conf in sorted(mods.glob("*.conf")):
            try:
                found, _ = _conf_values(conf)
            except (CorpusFormatError, CorpusNotFoundError):
                continue
            if found.lower() == name.lower():
                return read_conf(conf)
    raise CorpusNotFoundError(f"no SWORD module {name!r} in {', '.join(str(f) for f in folders)}")


def open_module(name: str, roots: Sequence[str | os.PathLike] | None = None) -> SwordModule:
    """:class:`SwordModule` for the module called ``name`` (see :func:`find_module`)."""
    return SwordModule(find_module(name, roots))


class SwordModule:
    """One zText Bible module, read whole on first use (a Bible is ~4 MB of text).

    Args:
        conf: the module's configuration (:func:`read_conf`, :func:`find_module`).

    Raises:
        CorpusFormatError: a driver, compression, markup, encoding or versification this reader does
            not support, or an enciphered module (each message names the key and the value).
        CorpusNotFoundError: a data file is missing.
    """

    def __init__(self, conf: SwordConf):
        self.conf = conf
        self._check()
        self._entries: dict[int, list[bytes]] = {}

    def _refuse(self, why: str) -> CorpusFormatError:
        return CorpusFormatError(f"SWORD module {self.conf.name} ({self.conf.conf_path}): {why}")

    def _check(self) -> None:
        c = self.conf
        if c.driver.lower() not in VERSE_INDEX_DTYPES:
            raise self._refuse(f"ModDrv={c.driver} is not supported; this reader reads zText and zText4")
        if c.compression not in _DECOMPRESS:
            raise self._refuse(f"CompressType={c.compression} is not supported; "
                               f"supported: {', '.join(_DECOMPRESS)}")
        if c.block_type not in BLOCK_LETTERS:
            raise self._refuse(f"BlockType={c.block_type} is unknown; known: {', '.join(BLOCK_LETTERS)}")
        if c.markup.lower() not in {m.lower() for m in MARKUPS}:
            raise self._refuse(f"SourceType={c.markup} is unknown; known: {', '.join(MARKUPS)}")
        if c.encoding.replace("-", "").upper() not in ("UTF8", "LATIN1"):
            raise self._refuse(f"Encoding={c.encoding} is unknown; known: UTF-8, Latin-1")
        if c.versification.upper() != "KJV":
            raise self._refuse(f"Versification={c.versification} is not supported; this reader knows KJV")
        if c.enciphered:
            raise self._refuse("it is enciphered (CipherKey=); unlock it with the SWORD tools first")
        for path in self.data_files():
            if not path.is_file():
                raise CorpusNotFoundError(f"SWORD module {c.name}: data file {path} is missing")

    def _testament_files(self, testament: int) -> list[Path]:
        prefix = ("ot", "nt")[testament - 1] + "." + BLOCK_LETTERS[self.conf.block_type]
        return [self.conf.data_path / f"{prefix}z{kind}" for kind in ("s", "v", "z")]

    def data_files(self) -> list[Path]:
        """The six data files: block index, verse index and blocks of each testament."""
        return self._testament_files(1) + self._testament_files(2)

    def _read_testament(self, testament: int) -> list[bytes]:
        """The raw bytes of every entry of one testament's verse index."""
        bzs, bzv, bzz = self._testament_files(testament)
        blocks = np.frombuffer(bzs.read_bytes(), dtype=BLOCK_INDEX_DTYPE,
                               count=bzs.stat().st_size // BLOCK_INDEX_DTYPE.itemsize)
        dtype = VERSE_INDEX_DTYPES[self.conf.driver.lower()]
        raw_index = bzv.read_bytes()
        want = index_size(testament)
        if len(raw_index) < want * dtype.itemsize:
            raise self._refuse(f"{bzv.name} holds {len(raw_index) // dtype.itemsize} entries; the KJV "
                               f"versification needs {want}")
        index = np.frombuffer(raw_index, dtype=dtype, count=want)
        data, decompress, cache = bzz.read_bytes(), _DECOMPRESS[self.conf.compression], {}
        entries = []
        for i, (block, start, size) in enumerate(index.tolist()):
            if size == 0:
                entries.append(b"")
                continue
            if block not in cache:
                cache[block] = self._block(blocks, block, data, decompress, bzz.name, i)
            text = cache[block]
            if start + size > len(text):
                raise self._refuse(f"{bzv.name} entry {i} reaches byte {start + size} of block {block}, "
                                   f"which holds {len(text)}")
            entries.append(text[start:start + size].split(b"\0", 1)[0])
        return entries

    def _block(self, blocks: np.ndarray, block: int, data: bytes, decompress, bzz: str, entry: int) -> bytes:
        if block >= len(blocks):
            raise self._refuse(f"verse index entry {entry} names block {block}; "
                               f"the block index has {len(blocks)}")
        offset, csize, usize = (int(x) for x in blocks[block])
        if offset + csize > len(data):
            raise self._refuse(f"block {block} ends at byte {offset + csize} of {bzz} ({len(data)} bytes)")
        try:
            text = decompress(data[offset:offset + csize])
        except (zlib.error, OSError, lzma.LZMAError, EOFError, ValueError) as e:
            raise self._refuse(f"block {block} of {bzz} does not decompress as {self.conf.compression} "
                               f"({e})") from None
        if len(text) != usize:
            raise self._refuse(f"block {block} of {bzz} decompresses to {len(text)} bytes; "
                               f"the block index says {usize}")
        return text

    def _decode(self, raw: bytes, key: VerseKey) -> str:
        utf8 = self.conf.encoding.replace("-", "").upper() == "UTF8"
        try:
            return raw.decode("utf-8") if utf8 else raw.decode("latin-1")
        except UnicodeDecodeError as e:
            raise CorpusDecodeError(
                f"SWORD module {self.conf.name}, {key}: not valid UTF-8 at byte {e.start} ({e.reason}) "
                f"although its configuration says Encoding={self.conf.encoding}") from None

    def raw(self, key: VerseKey) -> str:
        """The entry of one verse as stored (markup included)."""
        b = KJV_BOOKS[key.book - 1]
        if not (1 <= key.chapter <= len(b.chapters) and 1 <= key.verse <= b.chapters[key.chapter - 1]):
            raise ValueError(f"{b.osis} {key.chapter}:{key.verse} is not a verse of the KJV versification")
        if b.testament not in self._entries:
            self._entries[b.testament] = self._read_testament(b.testament)
        entry = next(e for e, k in _book_verses(b) if k == key)
        return self._decode(self._entries[b.testament][entry], key)

    def text(self, ref: str | VerseKey) -> str:
        """The plain text of one verse: ``text("John.3.16")`` or ``text(VerseKey(43, 3, 16))``."""
        return strip_markup(self.raw(_key(ref)), self.conf.markup)

    def verses(self) -> Iterator[Verse]:
        """Every verse of the versification in canonical order, empty ones with ``text=""``."""
        for testament in (1, 2):
            if testament not in self._entries:
                self._entries[testament] = self._read_testament(testament)
            entries = self._entries[testament]
            for entry, key in verse_entries(testament):
                yield Verse(key, strip_markup(self._decode(entries[entry], key), self.conf.markup))

    def __repr__(self) -> str:
        return f"SwordModule({self.conf.name}, {self.conf.data_path})"


def _book_verses(b) -> Iterator[tuple[int, VerseKey]]:
    return ((e, k) for e, k in verse_entries(b.testament) if k.book == b.number)


def _key(ref: str | VerseKey) -> VerseKey:
    if isinstance(ref, VerseKey):
        return ref
    parts = str(ref).rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise ValueError(f"a verse is written BOOK.CHAPTER.VERSE with an OSIS book id (e.g. John.3.16), "
                         f"got {ref!r}")
    return VerseKey(book(parts[0]).number, int(parts[1]), int(parts[2]))
