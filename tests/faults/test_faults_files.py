"""Damaged, truncated or foreign files of every kind qkv reads — token cache, model folder, search
index — and the folder replacements of ``convert``; each must give a clear error (or a repair),
never a traceback or a silently wrong result."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from faults_support import flip_middle, garbage_json, truncate_half

import qkv
from qkv.cli import main
from qkv.data.errors import CacheError
from qkv.embeddings.errors import EmbeddingError
from qkv.errors import CheckpointError

# ------------------------------------------------------------------------------------------ token cache


def _cache(tmp_path, texts, tokenizer):
    from qkv.data.cache import build_token_cache
    from qkv.data.corpus import Corpus

    corpus_file = tmp_path / "c.txt"
    corpus_file.write_text("\n".join(" ".join(t.split()) for t in texts[:20]) + "\n")
    from qkv.data.corpus import open_corpus

    corpus = open_corpus(str(corpus_file))
    assert isinstance(corpus, Corpus)
    return corpus, build_token_cache(corpus, tokenizer, tmp_path / "cache")


@pytest.mark.parametrize("name,damage", [("tokens.bin", flip_middle), ("doc_offsets.bin", flip_middle),
                                         ("word_starts.bin", flip_middle), ("tokens.bin", truncate_half),
                                         ("meta.json", garbage_json)])
def test_damaged_token_cache_is_detected_and_rebuilt(name, damage, tmp_path, texts, tokenizer, capsys):
    from qkv.data.cache import build_token_cache, open_token_cache

    corpus, cache = _cache(tmp_path, texts, tokenizer)
    good = np.array(cache.tokens).copy()
    damage(cache.path / name)
    with pytest.raises(CacheError, match=name if name != "meta.json" else "meta.json"):
        open_token_cache(cache.path)
    again = build_token_cache(corpus, tokenizer, tmp_path / "cache")
    assert not again.reused and np.array_equal(np.array(again.tokens), good)
    assert "rebuilding" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------- model folder


@pytest.mark.parametrize("name,damage,fragment", [
    ("model.safetensors", truncate_half, "model.safetensors"),
    ("qkv.json", garbage_json, "qkv.json"),
    ("tokenizer.json", garbage_json, "tokenizer.json"),
])
def test_damaged_model_folder_gives_a_clear_error(name, damage, fragment, model_copy, tmp_path, capsys):
    damage(model_copy / name)
    with pytest.raises(CheckpointError, match=fragment):
        qkv.load(model_copy)
    code = main(["embed", str(model_copy), str(model_copy / "qkv.json"), "--out", str(tmp_path / "x.npy")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and fragment in err


def test_malicious_pickle_is_refused_with_a_message(model_copy, capsys):
    import os
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    hf = model_copy.parent / "hf"
    qkv.convert(model_copy, hf)
    (hf / "model.safetensors").unlink()
    (hf / "pytorch_model.bin").write_bytes(pickle.dumps({"x": Evil()}))
    code = main(["convert", str(hf), str(model_copy.parent / "back")])
    err = capsys.readouterr().err
    assert code == 2 and "refused" in err and "Traceback" not in err and "UnpicklingError" not in err.split(":")[0]


def test_tokenizer_larger_than_the_vocabulary_is_refused(model_copy, tmp_path):
    from pydoc_data.topics import topics

    from qkv.data.tokenizer import train_tokenizer

    big = train_tokenizer(list(topics.values()), vocab_size=600, max_chars=400_000)
    big.backend.save(str(model_copy / "tokenizer.json"))
    (model_copy / "vocab.txt").unlink(missing_ok=True)
    with pytest.raises(CheckpointError, match="tokens but the model's vocabulary"):
        qkv.load(model_copy)


def _loads(folder: Path) -> bool:
    try:
        qkv.load(folder)
        return True
    except CheckpointError:
        return False


def test_convert_into_itself_leaves_a_loadable_folder(model_copy, capsys):
    before = qkv.load(model_copy).model
    assert main(["convert", str(model_copy), str(model_copy), "--to", "hf"]) == 0
    assert (model_copy / "config.json").is_file() and not (model_copy / "qkv.json").exists()
    after = qkv.load(model_copy).model
    ids = torch.randint(5, 100, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(before(ids, torch.ones_like(ids, dtype=torch.bool)).logits,
                                   after(ids, torch.ones_like(ids, dtype=torch.bool)).logits)
    assert main(["convert", str(model_copy), str(model_copy), "--to", "qkv"]) == 0
    assert _loads(model_copy) and not (model_copy / "config.json").exists()


def test_convert_into_an_existing_model_folder_keeps_no_old_tokenizer(model_copy, tmp_path):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (dst / "vocab.txt").write_text("[PAD]\nold\n")
    (dst / "tokenizer_config.json").write_text("{}")
    model = qkv.load(model_copy).model
    qkv.save(model, model_copy)  # a model folder without a tokenizer
    (model_copy / "tokenizer.json").unlink(missing_ok=True)
    (model_copy / "vocab.txt").unlink(missing_ok=True)
    qkv.convert(model_copy, dst, to="qkv")
    assert sorted(p.name for p in dst.iterdir()) == ["model.safetensors", "qkv.json"]


def test_killed_replace_between_renames_restores_the_old_folder(tmp_path):
    from qkv._fs import clean_stale_temps, temp_path

    dest = tmp_path / "m"
    old = temp_path(dest, "old")
    old.mkdir()
    (old / "qkv.json").write_text("{}")
    old.rename(old.with_name(old.name.replace(f"-{__import__('os').getpid()}-", "-999999999-")))
    clean_stale_temps(dest)
    assert (dest / "qkv.json").is_file()


# ---------------------------------------------------------------------------------------- search index


@pytest.fixture()
def index(tmp_path, model_folder, texts) -> Path:
    from qkv.embeddings.search import build_index

    out = tmp_path / "index"
    build_index(model_folder, [(i, t[:300]) for i, t in enumerate(texts[:12])], out, max_len=32)
    return out


@pytest.mark.parametrize("name,damage", [("vectors.npy", truncate_half), ("offsets.npy", truncate_half),
                                         ("texts.jsonl", truncate_half), ("index.json", garbage_json)])
def test_damaged_index_gives_a_clear_error(name, damage, index, capsys):
    damage(index / name)
    code = main(["search", str(index), "what is a class"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "qkv search: error:" in err, err


def test_an_index_with_one_nan_vector_is_refused_when_opened_not_ranked_around(index, capsys):
    """One NaN row among finite ones: its score is never among the best, so only opening can notice."""
    v = np.load(index / "vectors.npy", mmap_mode="r+")
    v[5] = np.nan
    v.flush()
    del v
    code = main(["search", str(index), "what is a class", "-k", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "holds non-finite (NaN/inf) vectors (row 5 first)" in err and "rebuild it" in err, err


def test_an_approximate_index_with_a_nan_vector_in_its_faiss_file_is_refused_when_opened(tmp_path, model_folder,
                                                                                        texts, capsys):
    """FAISS keeps its own copy of the vectors: a NaN written there (vectors.npy intact) is refused when the
    index is opened, as one in vectors.npy is, not ranked around."""
    faiss = pytest.importorskip("faiss", reason="faiss-cpu is not installed (make test installs it)")
    from qkv.embeddings.ann import AnnOptions
    from qkv.embeddings.search import build_index

    out = tmp_path / "hnsw"
    build_index(model_folder, [(i, t[:300]) for i, t in enumerate(texts[:12])], out, max_len=32,
                ann=AnnOptions(type="faiss-hnsw", hnsw_m=8))
    v = np.load(out / "vectors.npy").astype(np.float32)
    v[5] = np.nan
    damaged = faiss.IndexHNSWFlat(v.shape[1], 8, faiss.METRIC_INNER_PRODUCT)
    damaged.add(v)
    faiss.write_index(damaged, str(out / "ann.faiss"))
    code = main(["search", str(out), "what is a class", "-k", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "ann.faiss changed since the index was built" in err and "Traceback" not in err, err


def test_index_whose_model_tokenizer_changed_is_refused(tmp_path, model_copy, texts):
    from qkv.embeddings.search import build_index, search

    out = tmp_path / "ix"
    build_index(model_copy, [(i, t[:300]) for i, t in enumerate(texts[:6])], out, max_len=32)
    tok = json.loads((model_copy / "tokenizer.json").read_text())
    tok["normalizer"] = None
    (model_copy / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(EmbeddingError, match="tokenizer .* changed"):
        search(out, "a query")


def test_nan_vectors_are_refused_not_scored(tmp_path, model_copy, texts):
    from safetensors.torch import load_file, save_file

    from qkv.embeddings.search import build_index

    w = load_file(str(model_copy / "model.safetensors"))
    name = next(k for k in w if k.endswith("weight") and w[k].ndim == 2 and "embed" not in k)
    w[name] = torch.full_like(w[name], float("nan"))
    save_file(w, str(model_copy / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(EmbeddingError, match="non-finite"):
        build_index(model_copy, [(0, "some text here")], tmp_path / "ix", max_len=32)
    assert not (tmp_path / "ix").exists()


def test_killed_embed_temp_files_are_cleaned_by_the_next_run(tmp_path, model_folder, capsys):
    text = tmp_path / "d.txt"
    text.write_text("one\ntwo\n")
    import socket

    junk = tmp_path / f".x.npy.tmp-999999999-{socket.gethostname().replace('-', '_')}-abcdef12"
    junk.write_bytes(b"\0" * 1000)
    assert main(["embed", str(model_folder), str(text), "--out", str(tmp_path / "x.npy"), "--no-progress"]) == 0
    assert not junk.exists() and (tmp_path / "x.npy").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_ctrl_c_during_embed_or_tokenisation_is_one_line(tmp_path, model_folder, monkeypatch, capsys):
    import qkv.data.cache as cache_mod
    import qkv.embeddings.embedder as emb

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    text = tmp_path / "d.txt"
    text.write_text("one\ntwo\n")
    monkeypatch.setattr(emb.Embedder, "embed_stream", interrupt)
    code = main(["embed", str(model_folder), str(text), "--out", str(tmp_path / "x.npy")])
    err = capsys.readouterr().err
    assert code == 130 and "interrupted" in err and "Traceback" not in err
    assert not list(tmp_path.glob(".x.npy*")) and not (tmp_path / "x.npy").exists()
    monkeypatch.setattr(cache_mod, "_tokenise_into", interrupt)
    code = main(["pretrain", "--corpus", "dataset:pydoc", "--out", str(tmp_path / "r"), "--preset", "tiny",
                 "--max-len", "19", "--vocab-size", "200", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 130 and "interrupted" in err and "Traceback" not in err and not (tmp_path / "r").exists()


# ---------------------------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("similarity", ["dot", "scaled_dot", "cosine", "bilinear", "additive"])
@pytest.mark.parametrize("backend", ["auto", "explicit", "chunked"])
def test_float16_weights_path_is_finite_where_the_fused_path_is(similarity, backend):
    """float16 attention asked for its weights: finite wherever the fused path is — every similarity and
    backend, with padding, causal masks and a sliding window (scores overflow float16 without the float32
    softmax of the explicit path)."""
    from qkv.models.builders import build_attention

    torch.manual_seed(0)
    x = (torch.randn(2, 16, 64) * 60).half()
    padding = torch.ones(2, 16, dtype=torch.bool)
    padding[1, 10:] = False  # (B,T): the second row's last 6 positions are padding
    for window in (None, 4):
        m = build_attention(64, 4, similarity=similarity, backend=backend, window=window).half()
        for mask, causal in ((None, False), (padding, False), (padding, True)):
            with torch.no_grad():
                fused = m(x, mask, causal=causal).output
                explicit = m(x, mask, causal=causal, need_weights=True)
            assert torch.isfinite(fused).all(), (window, causal)
            assert torch.isfinite(explicit.output).all() and torch.isfinite(explicit.weights).all(), (window, causal)
            assert explicit.weights.dtype == torch.float16


def test_messages_suggest_only_options_the_command_has(tmp_path, index, model_folder, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    code = main(["analyze", str(model_folder), "--corpus", str(bad), "--out", str(tmp_path / "a"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "not valid UTF-8" in err and "--encoding-errors replace" in err, err
    code = main(["search", str(index), "  "])
    err = capsys.readouterr().err
    assert code == 2 and "query 1 is empty" in err and "--empty" not in err, err
