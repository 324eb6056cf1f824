"""The SWORD zText reader on modules the tests write (every layout option), its errors, and the two
installed Debian modules (skipped without them)."""

from __future__ import annotations

import struct

import pytest

from qkv.data.errors import CorpusDecodeError, CorpusFormatError, CorpusNotFoundError
from qkv.data.sword import SwordModule, find_module, open_module, read_conf, sword_roots
from qkv.data.versification import KJV_VERSES, VerseKey

VERSES = {
    "Gen.1.1": 'In the <w lemma="strong:H7225">beginning</w> <w lemma="strong:H0430">God</w> created.',
    "Gen.1.2": ('And the earth was <transChange type="added">without</transChange> form.'
                '<note placement="foot"><reference type="annotateRef">1.2 </reference>form: Heb. '
                '<seg>void</seg></note>'),
    "Exod.6.3": "by my name \\nd <w>JEHOVAH</w> was I not known",
    "Ps.3.1": ('<div type="x-milestone" subType="x-preverse" sID="pv1"/>'
               '<title canonical="true" type="psalm">A <w lemma="strong:H4210">Psalm</w> of David.</title> '
               '<l level="1" sID="x"/>LORD, how are they increased!<l eID="x" level="1"/>'),
    "Mal.4.6": "¶ Lest I come &amp; smite the earth.",
    "Matt.1.1": '<title type="main" level="1">A heading</title>The book of the generation.',
    "3John.1.14": "Peace be to thee.",
    "Rev.22.21": "The grace of our Lord Jesus Christ be with you all. Amen.",
}
PLAIN = {
    "Gen.1.1": "In the beginning God created.",
    "Gen.1.2": "And the earth was without form.",
    "Exod.6.3": "by my name JEHOVAH was I not known",
    "Ps.3.1": "A Psalm of David. LORD, how are they increased!",
    "Mal.4.6": "Lest I come & smite the earth.",
    "Matt.1.1": "The book of the generation.",
    "3John.1.14": "Peace be to thee.",
    "Rev.22.21": "The grace of our Lord Jesus Christ be with you all. Amen.",
}


def _module(tmp_path, write_sword, verses=VERSES, **options) -> SwordModule:
    return SwordModule(read_conf(write_sword(tmp_path, "TestKJV", verses, **options)))


def test_reads_every_verse_in_canonical_order(tmp_path, write_sword):
    verses = list(_module(tmp_path, write_sword).verses())
    assert len(verses) == KJV_VERSES == 31102
    assert [v.key for v in verses] == sorted(v.key for v in verses)
    assert {str(v.key): v.text for v in verses if v.text} == PLAIN
    assert verses[0].key == VerseKey(1, 1, 1) and verses[-1].key == VerseKey(66, 22, 21)


@pytest.mark.parametrize("compression", ["ZIP", "BZIP2", "XZ"])
@pytest.mark.parametrize("block_type", ["BOOK", "CHAPTER", "VERSE"])
def test_compressions_and_block_types(tmp_path, write_sword, compression, block_type):
    m = _module(tmp_path, write_sword, compression=compression, block_type=block_type)
    assert {str(v.key): v.text for v in m.verses() if v.text} == PLAIN


def test_ztext4_and_single_verse_access(tmp_path, write_sword):
    m = _module(tmp_path, write_sword, driver="zText4")
    assert m.text("Ps.3.1") == PLAIN["Ps.3.1"]
    assert m.text(VerseKey(64, 1, 14)) == "Peace be to thee."
    assert m.raw(VerseKey(1, 1, 1)) == VERSES["Gen.1.1"]
    assert m.text("John.3.16") == ""
    with pytest.raises(ValueError, match="not a verse of the KJV versification"):
        m.text("Gen.51.1")
    with pytest.raises(ValueError, match="BOOK.CHAPTER.VERSE"):
        m.text("Genesis 1:1")


def test_unicode_in_utf8_and_latin1(tmp_path, write_sword):
    text = "EN el principio crió Dios los cielos y la tierra. ¿Quién? ¡Oh! Señor, Jehová, Amén."
    for encoding in ("UTF-8", "Latin-1"):
        m = _module(tmp_path / encoding, write_sword, {"Gen.1.1": text}, encoding=encoding, markup="Plain")
        assert m.text("Gen.1.1") == text


def test_invalid_utf8_is_one_line_naming_the_verse(tmp_path, write_sword):
    m = _module(tmp_path, write_sword, {"Gen.1.1": "crió"}, encoding="Latin-1")
    conf = m.conf.conf_path
    conf.write_text(conf.read_text().replace("Encoding=Latin-1", "Encoding=UTF-8"))
    with pytest.raises(CorpusDecodeError, match=r"TestKJV, Gen\.1\.1: not valid UTF-8") as e:
        list(SwordModule(read_conf(conf)).verses())
    assert "\n" not in str(e.value)


def test_conf_parsing(tmp_path):
    (tmp_path / "mods.d").mkdir()
    conf = tmp_path / "mods.d" / "x.conf"
    conf.write_text("# a comment\n[MyMod]\nDataPath=./modules/texts/ztext/mymod/\nmoddrv=zText\n"
                    "About=first line \\\nsecond line\nGlobalOptionFilter=OSISStrongs\nGlobalOptionFilter=B\n"
                    "Lang=es\n")
    c = read_conf(conf)
    assert (c.name, c.driver, c.lang) == ("MyMod", "zText", "es")
    assert c.data_path == (tmp_path / "modules/texts/ztext/mymod").resolve()
    # SWORD's defaults where a key is absent
    assert (c.markup, c.encoding, c.compression, c.block_type, c.versification) == (
        "Plain", "Latin-1", "LZSS", "CHAPTER", "KJV")
    conf.write_text("[NoPath]\nModDrv=zText\n")
    with pytest.raises(CorpusFormatError, match=r"module \[NoPath\] has no DataPath="):
        read_conf(conf)
    conf.write_text("just text\n")
    with pytest.raises(CorpusFormatError, match="not a SWORD module configuration"):
        read_conf(conf)


@pytest.mark.parametrize("extra, message", [
    ("CipherKey=secret\n", "enciphered"),
    ("Versification=Catholic\n", "Versification=Catholic is not supported"),
    ("ModDrv=RawText\n", "ModDrv=RawText is not supported"),
    ("CompressType=LZSS\n", "CompressType=LZSS is not supported"),
    ("SourceType=TEI\n", "SourceType=TEI is unknown"),
    ("Encoding=UTF-16\n", "Encoding=UTF-16 is unknown"),
])
def test_unsupported_modules_are_refused_in_one_line(tmp_path, write_sword, extra, message):
    conf = write_sword(tmp_path, "Odd", {"Gen.1.1": "x"})
    key = extra.split("=")[0]
    lines = [line for line in conf.read_text().splitlines() if not line.startswith(key + "=")]
    conf.write_text("\n".join(lines) + "\n" + extra)
    with pytest.raises(CorpusFormatError, match=message) as e:
        SwordModule(read_conf(conf))
    assert "\n" not in str(e.value) and "Odd" in str(e.value)


def test_broken_data_files(tmp_path, write_sword):
    conf = write_sword(tmp_path, "Broken", {"Gen.1.1": "In the beginning.", "Matt.1.1": "The book."})
    data = read_conf(conf).data_path
    (data / "nt.bzz").write_bytes(b"not zlib at all, long enough")
    with pytest.raises(CorpusFormatError, match="block 0 of nt.bzz does not decompress as ZIP"):
        list(SwordModule(read_conf(conf)).verses())
    bzs = data / "ot.bzs"
    offset, csize, usize = struct.unpack("<III", bzs.read_bytes()[:12])
    bzs.write_bytes(struct.pack("<III", offset, csize, usize + 1))
    with pytest.raises(CorpusFormatError, match="decompresses to 17 bytes; the block index says 18"):
        list(SwordModule(read_conf(conf)).verses())
    (data / "ot.bzv").write_bytes((data / "ot.bzv").read_bytes()[:1000])
    with pytest.raises(CorpusFormatError, match="ot.bzv holds 100 entries; the KJV versification needs"):
        list(SwordModule(read_conf(conf)).verses())
    (data / "ot.bzs").unlink()
    with pytest.raises(CorpusNotFoundError, match="data file .*ot.bzs is missing"):
        SwordModule(read_conf(conf))


def test_entry_pointing_past_its_block(tmp_path, write_sword):
    conf = write_sword(tmp_path, "Past", {"Gen.1.1": "In the beginning."})
    bzv = read_conf(conf).data_path / "ot.bzv"
    index = bytearray(bzv.read_bytes())
    struct.pack_into("<IIH", index, 4 * 10, 0, 0, 500)
    bzv.write_bytes(bytes(index))
    with pytest.raises(CorpusFormatError, match="entry 4 reaches byte 500 of block 0, which holds 17"):
        list(SwordModule(read_conf(conf)).verses())


def test_find_module_searches_sword_path_first(tmp_path, write_sword, monkeypatch):
    write_sword(tmp_path / "lib", "FixtureMod", {"Gen.1.1": "x"}, conf_name="whatever")
    monkeypatch.setenv("SWORD_PATH", str(tmp_path / "lib"))
    assert sword_roots()[0] == tmp_path / "lib"
    assert find_module("fixturemod").name == "FixtureMod"
    assert open_module("FIXTUREMOD").text("Gen.1.1") == "x"
    with pytest.raises(CorpusNotFoundError, match=r"no SWORD module 'nothere' in .*lib, .*\.sword"):
        find_module("nothere")


# -- the installed Debian modules ----------------------------------------------------------------------

def _installed(name: str) -> SwordModule:
    try:
        return open_module(name, ["/usr/share/sword"])
    except CorpusNotFoundError:
        pytest.skip(f"SWORD module {name} not installed; run `make data` (Debian sword-text-kjv/-sparv)")


@pytest.mark.parametrize("name, lang, first, accents", [
    ("engKJV2006eb", "en", "In the beginning God created the heaven and the earth.", ""),
    ("spaRV1909eb", "es", "EN el principio crió Dios los cielos y la tierra.", "áéíóúñ¿¡"),
])
def test_installed_modules(name, lang, first, accents):
    m = _installed(name)
    assert m.conf.versification.upper() == "KJV" and m.conf.lang == lang and m.conf.markup == "OSIS"
    verses = list(m.verses())
    assert len(verses) == 31102 and verses[0].text == first
    text = " ".join(v.text for v in verses)
    assert not any(mark in text for mark in ("<", ">", "lemma", "&", "\\", "¶"))
    assert all(ch in text for ch in accents)
    assert sum(bool(v.text) for v in verses) >= 31080


def test_installed_chapter_headings_sit_where_the_versification_says(sword_entry_of):
    """Each chapter-heading entry (just before verse 1) carries the chapter's OSIS id: every book and
    chapter of the versification table lands on the module's own markers."""
    from qkv.data.versification import KJV_BOOKS

    m = _installed("engKJV2006eb")
    entries = {t: m._read_testament(t) for t in (1, 2)}
    for b in KJV_BOOKS:
        for chapter in range(1, len(b.chapters) + 1):
            testament, entry = sword_entry_of(b.osis, chapter, 1)
            assert f'osisID="{b.osis}.{chapter}"'.encode() in entries[testament][entry - 1]
