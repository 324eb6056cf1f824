"""The tokenizer facade: loading from folders and files, the view without truncation or padding,
the special-token check, and the model-folder files (qkv.data.tokenizer_facade)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qkv.data.errors import TokenizerError
from qkv.data.tokenizer_facade import (
    TokenizerFile,
    TokenizerView,
    as_backend,
    no_tokenizer,
    read_tokenizer,
    special_ids,
    write_tokenizer,
)

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "the", "cat", "##s", "sat"]


def _vocab_folder(tmp_path, lines=VOCAB, config=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return tmp_path


def test_read_from_folder_file_and_vocab(pydoc_tokenizer, tmp_path):
    assert read_tokenizer(tmp_path) is None  # a folder without a tokenizer
    path = pydoc_tokenizer.save(tmp_path / "tok")
    for where in (tmp_path / "tok", path):
        assert read_tokenizer(where).to_str() == pydoc_tokenizer.to_str()
    folder = _vocab_folder(tmp_path / "v")
    tok = read_tokenizer(folder)
    assert tok.encode("Hello cats").ids == [2, 5, 8, 9, 3]  # lower-cased WordPiece, [CLS] … [SEP]
    assert read_tokenizer(folder / "vocab.txt").to_str() == tok.to_str()
    cased = read_tokenizer(_vocab_folder(tmp_path / "c", config={"do_lower_case": False}))
    assert cased.encode("Hello").ids == [2, 1, 3]


def test_vocab_with_registered_specials_is_bert_wordpiece(tmp_path):
    from tokenizers.implementations import BertWordPieceTokenizer

    folder = _vocab_folder(tmp_path)
    ours = read_tokenizer(folder, register_specials=True)
    assert ours.to_str() == BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=True)._tokenizer.to_str()
    assert json.loads(read_tokenizer(folder).to_str())["added_tokens"] == []  # model folders: as qkv.load read them


def test_read_errors_name_the_file(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer path not found"):
        read_tokenizer(tmp_path / "missing")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"cannot load a tokenizer from .*tokenizer\.json"):
        read_tokenizer(tmp_path)
    bad = _vocab_folder(tmp_path / "b")
    (bad / "tokenizer_config.json").write_text("[1, 2")
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json: not a readable JSON object"):
        read_tokenizer(bad)


def test_view_has_no_truncation_or_padding_and_leaves_the_original(pydoc_tokenizer):
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(pydoc_tokenizer.to_str())
    backend.enable_truncation(4)
    backend.enable_padding(length=16)
    view = TokenizerView(backend)
    text = "the quick brown fox jumps over the lazy dog"
    ids = view.encode([text, ""])
    assert ids[0].dtype == np.int64 and len(ids[0]) > 4 and len(ids[1]) == 0
    assert ids[0].tolist() == pydoc_tokenizer.encode(text, add_special_tokens=False)
    assert len(backend.encode(text).ids) == 16, "the caller's tokenizer keeps its settings"
    sp = pydoc_tokenizer.special
    assert (view.cls_id, view.sep_id, view.pad_id, view.unk_id, view.mask_id) == (sp.cls, sp.sep, sp.pad, sp.unk,
                                                                                   sp.mask)
    assert TokenizerView(pydoc_tokenizer).backend.to_str() == TokenizerView(pydoc_tokenizer.backend).backend.to_str()
    assert view.id_to_token(10**6) == f"<{10**6}>"


def test_words_and_pretokenized(pydoc_tokenizer):
    view = TokenizerView(pydoc_tokenizer)
    (ids, whole), = view.encode_words(["unbelievable cat"])
    assert ids.tolist() == view.encode(["unbelievable cat"])[0].tolist() and whole.dtype == bool
    words = view.encode_pretokenized([["unbelievable", "cat"], ["the"]])
    assert [len(w) for w in words] == [2, 1] and len(words[0][0]) > 1
    assert np.concatenate(words[0]).tolist() == ids.tolist()
    assert whole.tolist() == [len(w) == 1 for w in words[0] for _ in w]  # the only piece of its word


def test_special_check_messages():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    bare = Tokenizer(WordLevel({"[CLS]": 0, "a": 1}, unk_token="a"))
    with pytest.raises(TokenizerError, match=r"^tokenizer lacks the special token\(s\) \[PAD\], \[UNK\], \[SEP\], "
                                             r"\[MASK\]; qkv needs all of"):
        special_ids(bare)
    with pytest.raises(ValueError, match=r"^the tokenizer has no sep, mask token \(sep: none of its settings or "
                                         r"\[SEP\]/</s>; mask: .*\[MASK\]/<mask>.*; it has cls=\[CLS\] unk=a bos=\[CLS\]\); fill-mask"):
        TokenizerView(bare, required=("sep", "[MASK]"), error=ValueError, purpose="fill-mask needs them")
    assert TokenizerView(bare).prefix == TokenizerView(bare).suffix == ()  # no template; none required by default
    with pytest.raises(TokenizerError, match="expected a tokenizers.Tokenizer"):
        as_backend("not a tokenizer")
    msg = str(no_tokenizer("model folder m", hint=", or pass tokenizer="))
    assert msg.startswith("model folder m has no tokenizer (expected tokenizer.json or vocab.txt") and "\n" not in msg
    assert msg.endswith(", or pass tokenizer=")


def test_write_tokenizer_files(pydoc_tokenizer, tmp_path):
    (tmp_path / "q").mkdir()
    write_tokenizer(pydoc_tokenizer, tmp_path / "q", max_len=64)
    assert sorted(p.name for p in (tmp_path / "q").iterdir()) == ["tokenizer.json", "tokenizer_config.json",
                                                                    "vocab.txt"]
    assert read_tokenizer(tmp_path / "q").to_str() == pydoc_tokenizer.to_str()
    (tmp_path / "h").mkdir()
    write_tokenizer(pydoc_tokenizer.backend, tmp_path / "h", max_len=64)
    settings = json.loads((tmp_path / "h" / "tokenizer_config.json").read_text())
    assert settings == {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 64,
                        "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                        "mask_token": "[MASK]"}
    write_tokenizer(None, tmp_path / "h", max_len=64)  # nothing to write: nothing changes
    (tmp_path / "f").mkdir()
    TokenizerFile(pydoc_tokenizer).save(tmp_path / "f")
    assert [p.name for p in (tmp_path / "f").iterdir()] == ["tokenizer.json"]
