"""The translation subword vocabulary: exact round trip of cased, accented text, the special ids,
and one-line refusals."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models

from qkv.translation.errors import TranslationError
from qkv.translation.subwords import BOS, EOS, PAD, SPECIALS, UNK, check_subwords, train_subwords

TEXTS = ["En el principio crió Dios los cielos y la tierra.", "In the beginning God created the heaven and the earth.",
         "¿Quién es éste, que viene de Edom?", "And God said, Let there be light: and there was light.",
         "Y dijo Dios: Sea la luz: y fué la luz.", "¡Jehová! Él habló: «sí»."] * 3


def test_specials_come_first_and_text_round_trips_exactly():
    tok = train_subwords(TEXTS, vocab_size=120, min_frequency=1)
    assert [tok.token_to_id(s) for s in SPECIALS] == [PAD, BOS, EOS, UNK] == [0, 1, 2, 3]
    for text in TEXTS[:6] + ["Él creó la luz, ¿y quién?"]:  # characters seen in training
        assert tok.decode(tok.encode(text).ids) == text
    assert tok.get_vocab_size() <= 120


def test_unseen_characters_become_unk_not_dropped():
    tok = train_subwords(TEXTS, vocab_size=80, min_frequency=1)
    assert UNK in tok.encode("漢").ids


@pytest.mark.parametrize("kwargs, match", [(dict(vocab_size=10), "vocab_size must be an int ≥ 64"),
                                           (dict(vocab_size=True), "vocab_size must be an int")])
def test_bad_sizes_are_refused(kwargs, match):
    with pytest.raises(TranslationError, match=match):
        train_subwords(TEXTS, **kwargs)


def test_no_text_and_foreign_tokenizers_are_refused():
    with pytest.raises(TranslationError, match="no text to learn"):
        train_subwords(["", "  "])
    other = Tokenizer(models.WordLevel({"a": 0, "[PAD]": 1}, unk_token="a"))
    with pytest.raises(TranslationError, match=r"ids 0-3.*\[PAD\]=1"):
        check_subwords(other)
