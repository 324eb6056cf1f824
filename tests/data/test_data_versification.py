"""The KJV versification table and the verse-index walk."""

from __future__ import annotations

import pytest

from qkv.data.versification import KJV_BOOKS, KJV_VERSES, VerseKey, book, index_size, verse_entries


def test_table_totals():
    """The published totals of the KJV canon: 66 books, 1,189 chapters, 23,145 + 7,957 verses."""
    assert len(KJV_BOOKS) == 66 and sum(len(b.chapters) for b in KJV_BOOKS) == 1189
    assert sum(b.verses for b in KJV_BOOKS if b.testament == 1) == 23145
    assert sum(b.verses for b in KJV_BOOKS if b.testament == 2) == 7957 and KJV_VERSES == 31102
    assert [b.number for b in KJV_BOOKS] == list(range(1, 67))
    assert (book("Ps").chapters[118], book("3John").chapters, book("Gen").chapters[0]) == (176, (14,), 31)


def test_book_lookup():
    assert book("gen") is book("Genesis") is KJV_BOOKS[0]
    assert book("1 Samuel").osis == "1Sam" and book("REV").name == "Revelation"
    with pytest.raises(ValueError, match="unknown Bible book 'Gn'; use an OSIS id: Gen Exod"):
        book("Gn")


def test_index_walk():
    ot, nt = list(verse_entries(1)), list(verse_entries(2))
    assert (len(ot), len(nt)) == (23145, 7957)
    assert ot[0] == (4, VerseKey(1, 1, 1)) and nt[0] == (4, VerseKey(40, 1, 1))
    assert ot[31] == (36, VerseKey(1, 2, 1))  # Gen 1 has 31 verses; Gen 2's heading is entry 35
    assert (ot[-1][0], nt[-1][0]) == (index_size(1) - 1, index_size(2) - 1) == (24114, 8245)
    assert str(nt[-1][1]) == "Rev.22.21"
