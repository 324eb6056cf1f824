"""The memory-mapped token cache: contents, hits, invalidation, atomic writes (qkv.data.cache)."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest

from qkv.data.cache import build_token_cache, open_token_cache
from qkv.data.corpus import Corpus
from qkv.data.errors import CacheError, CorpusDecodeError, EmptyCorpusError
from qkv.data.tokenizer import WordPieceTokenizer, train_tokenizer


def _write(tmp_path, lines, name="c.txt"):
    f = tmp_path / name
    f.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return f


def test_contents_match_the_tokenizer(pydoc_tokenizer, pydoc_cache):
    c = pydoc_cache
    texts = list(Corpus("dataset:pydoc"))
    assert c.n_docs == len(texts) and c.tokens.dtype == np.uint16 and c.word_starts.dtype == np.bool_
    assert c.doc_offsets[0] == 0 and c.doc_offsets[-1] == c.n_tokens
    assert (np.diff(c.doc_offsets) > 0).all()
    for i in (0, 17, len(texts) - 1):
        ids, ws = c.document(i)
        want_ids, want_ws = pydoc_tokenizer.encode_documents([texts[i]])[0]
        assert ids.tolist() == want_ids.tolist() and ws.tolist() == want_ws.tolist()
    assert c.meta["tokenizer_fingerprint"] == pydoc_tokenizer.fingerprint()


def test_second_call_hits_without_tokenising(pydoc_tokenizer, tmp_path, monkeypatch):
    f = _write(tmp_path, [f"line {i} of text" for i in range(50)])
    first = build_token_cache(Corpus(f), pydoc_tokenizer, tmp_path / "cache")
    assert first.reused is False

    def boom(self, texts):
        raise AssertionError("re-tokenised on a cache hit")

    monkeypatch.setattr(WordPieceTokenizer, "encode_documents", boom)
    second = build_token_cache(Corpus(f), pydoc_tokenizer, tmp_path / "cache")
    assert second.reused is True and second.path == first.path
    assert np.array_equal(second.tokens, first.tokens)
    reopened = open_token_cache(first.path)  # O(1) reopen on resume
    assert reopened.n_tokens == first.n_tokens


def test_invalidated_when_content_or_tokenizer_changes(pydoc_tokenizer, tmp_path):
    f = _write(tmp_path, ["alpha beta", "gamma"])
    a = build_token_cache(Corpus(f), pydoc_tokenizer, tmp_path / "cache")
    _write(tmp_path, ["alpha beta", "gamma delta"])
    b = build_token_cache(Corpus(f), pydoc_tokenizer, tmp_path / "cache")
    assert b.reused is False and b.path != a.path and b.n_tokens > a.n_tokens
    other = train_tokenizer(["alpha beta gamma delta"] * 5, vocab_size=40)
    c = build_token_cache(Corpus(f), other, tmp_path / "cache")
    assert c.reused is False and c.path not in (a.path, b.path)


def test_interrupted_tokenisation_leaves_no_cache(pydoc_tokenizer, tmp_path, monkeypatch):
    f = _write(tmp_path, [f"doc {i}" for i in range(100)])
    calls = {"n": 0}
    real = WordPieceTokenizer.encode_documents

    def interrupt_on_third_batch(self, texts):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, texts)

    monkeypatch.setattr(WordPieceTokenizer, "encode_documents", interrupt_on_third_batch)
    with pytest.raises(KeyboardInterrupt):
        build_token_cache(Corpus(f), pydoc_tokenizer, tmp_path / "cache", batch_docs=10)
    assert list((tmp_path / "cache").iterdir()) == []
    monkeypatch.setattr(WordPieceTokenizer, "encode_documents", real)
    ok = build_token_cache(Corpus(f), pydoc_tokenizer, tmp_path / "cache", batch_docs=10)
    assert ok.reused is False and ok.n_docs == 100


def test_a_foreign_incomplete_folder_is_replaced(pydoc_tokenizer, tmp_path):
    f = _write(tmp_path, ["some words"])
    good = build_token_cache(Corpus(f), pydoc_tokenizer, tmp_path / "cache")
    (good.path / "meta.json").unlink()
    again = build_token_cache(Corpus(f), pydoc_tokenizer, tmp_path / "cache")
    assert again.reused is False and again.path == good.path and again.n_tokens == good.n_tokens


def test_stale_temp_folder_of_a_dead_process_is_removed(pydoc_tokenizer, tmp_path):
    cache_dir = tmp_path / "cache"
    stale = cache_dir / f".tmp-0123456789ab-999999999-deadbeef-{socket.gethostname()}"
    stale.mkdir(parents=True)
    (stale / "tokens.bin").write_bytes(b"\0" * 10)
    build_token_cache(Corpus(_write(tmp_path, ["x y z"])), pydoc_tokenizer, cache_dir)
    assert not stale.exists()


def test_bad_corpus_raises_before_a_cache_exists(pydoc_tokenizer, tmp_path):
    f = tmp_path / "bad.txt"
    f.write_bytes(b"good\n\xff\xfe bad\n")
    with pytest.raises(CorpusDecodeError, match="byte offset 5"):
        build_token_cache(Corpus(f), pydoc_tokenizer, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []
    g = _write(tmp_path, ["\x01\x02\x03"], "ctrl.txt")  # non-blank text that tokenises to nothing
    with pytest.raises(EmptyCorpusError, match="no token"):
        build_token_cache(Corpus(g), pydoc_tokenizer, tmp_path / "cache")


def test_open_rejects_incomplete_or_foreign_folders(pydoc_tokenizer, tmp_path):
    good = build_token_cache(Corpus(_write(tmp_path, ["some words here"])), pydoc_tokenizer, tmp_path / "c")
    with pytest.raises(CacheError, match="incomplete"):
        open_token_cache(tmp_path)
    meta = json.loads((good.path / "meta.json").read_text())
    meta["n_tokens"] += 1
    (good.path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CacheError, match="tokens.bin has"):
        open_token_cache(good.path)
    meta["format"] = 999
    (good.path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CacheError, match="format 999"):
        open_token_cache(good.path)
