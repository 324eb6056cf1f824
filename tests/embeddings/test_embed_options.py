"""EmbedOptions: validation messages, replace / to_dict round trip, folder defaults against explicit
choices, the keyword API of qkv.embed, and the one options object of the command line."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

import qkv
from qkv.embeddings.embedder import Embedder
from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.options import EmbedOptions
from qkv.embeddings.options import VECTOR_FIELDS, as_options
from qkv.errors import QkvError

FIELDS = ("pooling", "layers", "normalize", "max_len", "stride", "truncate", "empty", "batch_size",
          "batch_tokens", "precision", "chunk_size", "device", "progress")


def _error(exc_type=EmbeddingError, **options) -> str:
    with pytest.raises(exc_type) as info:
        EmbedOptions(**options)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_defaults():
    o = EmbedOptions()
    assert EmbedOptions.field_names() == FIELDS
    assert (o.pooling, o.layers, o.normalize, o.max_len, o.stride, o.truncate) == (None, None, None, None,
                                                                                   None, False)
    assert o.resolved(n_layers=2, max_positions=32).normalize is True  # unset: the folder's, else True
    assert (o.empty, o.batch_size, o.chunk_size, o.device, o.progress) == ("error", 256, 4096, None, False)
    assert (o.batch_tokens, o.precision) == (4096, "fp32")
    with pytest.raises(TypeError):
        EmbedOptions("cls")  # keywords only


@pytest.mark.parametrize("options,fragments", [
    (dict(pooling="median"), ["pooling='median'", "allowed: mean, cls, max, mean_sqrt_len"]),
    (dict(empty="drop"), ["empty='drop'", "allowed: error, zero, skip"]),
    (dict(layers=()), ["layers is empty", "-1"]),
    (dict(layers="last"), ["layers must be an int or a sequence of ints", "'last'"]),
    (dict(layers=(-1, "2")), ["holds '2', not an int", "-1 the last layer"]),
    (dict(layers=(True,)), ["holds True"]),
    (dict(normalize="yes"), ["normalize='yes'", "allowed: True, False"]),
    (dict(truncate=None), ["truncate=None", "allowed: True, False"]),
    (dict(progress="no"), ["progress='no'"]),
    (dict(batch_size=0), ["batch_size=0 must be an int ≥ 1"]),
    (dict(batch_size=2.0), ["batch_size=2.0 must be an int ≥ 1"]),
    (dict(chunk_size=-1), ["chunk_size=-1 must be an int ≥ 1"]),
    (dict(batch_tokens=0), ["batch_tokens=0 must be an int ≥ 1", "None"]),
    (dict(precision="fp16"), ["precision='fp16'", "allowed: fp32, bf16, int8"]),
    (dict(max_len=2), ["max_len=2 must be an int ≥ 3", "[CLS], [SEP]", "None"]),
    (dict(max_len="64"), ["max_len='64'"]),
    (dict(stride=0), ["stride=0 must be an int ≥ 1"]),
    (dict(max_len=16, stride=15), ["stride=15 must be in [1, 14]", "skip tokens"]),
])
def test_validation_messages_name_the_value_and_the_allowed_ones(options, fragments):
    message = _error(**options)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_device_is_checked_on_construction():
    assert "'banana' is not a device" in _error(QkvError, device="banana")
    assert EmbedOptions(device="cpu").device == "cpu" and EmbedOptions(device="auto").device == "auto"


def test_values_are_normalised():
    assert EmbedOptions(layers=-2).layers == (-2,)
    assert EmbedOptions(layers=[-4, -3]).layers == (-4, -3)
    assert EmbedOptions(normalize=0).normalize is False and EmbedOptions(truncate=1).truncate is True
    assert EmbedOptions(max_len=16, stride=14).stride == 14  # the largest stride that skips nothing
    hash(EmbedOptions(layers=[1, 2]))  # frozen and hashable: usable as a cache key


def test_replace_is_a_validated_copy():
    base = EmbedOptions(pooling="cls")
    changed = base.replace(max_len=64, layers=[-1])
    assert changed == EmbedOptions(pooling="cls", max_len=64, layers=(-1,)) and base.max_len is None
    assert base.replace() is base
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.pooling = "max"
    with pytest.raises(EmbeddingError, match=r"stride=63 must be in \[1, 62\]"):
        changed.replace(stride=63)
    with pytest.raises(EmbeddingError) as info:
        base.replace(poolng="max")
    assert str(info.value) == ("unknown embedding option 'poolng' (did you mean pooling?); allowed: "
                               + ", ".join(FIELDS))


def test_to_dict_from_dict_round_trip():
    o = EmbedOptions(pooling="mean_sqrt_len", layers=(-4, -1), normalize=False, max_len=64, stride=20,
                     truncate=True, empty="zero", batch_size=8, chunk_size=100, device="cpu", progress=True)
    d = o.to_dict()
    assert list(d) == list(FIELDS) and d["layers"] == [-4, -1]
    assert json.loads(json.dumps(d)) == d  # JSON-ready
    assert EmbedOptions.from_dict(json.loads(json.dumps(d))) == o
    assert EmbedOptions.from_dict({}) == EmbedOptions()
    assert list(o.to_dict(VECTOR_FIELDS)) == list(VECTOR_FIELDS)
    import torch

    assert EmbedOptions(device=torch.device("cpu")).to_dict()["device"] == "cpu"
    with pytest.raises(EmbeddingError, match="unknown embedding option 'window'; allowed: pooling"):
        EmbedOptions.from_dict({"window": 32})
    with pytest.raises(EmbeddingError, match="must be a JSON object, got list"):
        EmbedOptions.from_dict([["pooling", "cls"]])
    with pytest.raises(EmbeddingError, match="pooling='median'"):
        EmbedOptions.from_dict({"pooling": "median"})


def test_folder_defaults_fill_only_unset_fields():
    folder = {"pooling": "max", "layers": [-2, -1], "max_len": 512}
    filled = EmbedOptions().with_folder_defaults(folder, max_positions=256)
    assert (filled.pooling, filled.layers, filled.max_len) == ("max", (-2, -1), 256)  # declared: cut
    mine = EmbedOptions(pooling="cls", layers=0, max_len=300).with_folder_defaults(folder, max_positions=256)
    assert (mine.pooling, mine.layers, mine.max_len) == ("cls", (0,), 300)  # explicit: kept (checked later)
    assert EmbedOptions(stride=5).with_folder_defaults({}) == EmbedOptions(stride=5)
    with pytest.raises(EmbeddingError, match=r"pooling='median' is not allowed.*\(declared by the model fo"):
        EmbedOptions().with_folder_defaults({"pooling": "median"})
    with pytest.raises(EmbeddingError) as info:  # the user's stride against the folder's window
        EmbedOptions(stride=31).with_folder_defaults({"max_len": 16})
    assert "stride=31 must be in [1, 14]" in str(info.value) and "declared" not in str(info.value)


def test_resolved_defaults_and_model_checks():
    r = EmbedOptions().resolved(n_layers=6, max_positions=256)
    assert (r.pooling, r.layers, r.max_len, r.stride) == ("mean", (6,), 256, 190)  # 3/4 of 254 text tokens
    assert r.resolved(n_layers=6, max_positions=256) == r
    assert EmbedOptions(layers=(-4, -3, -2, -1)).resolved(n_layers=6, max_positions=32).layers == (3, 4, 5, 6)
    with pytest.raises(EmbeddingError, match="out of range for a model with 6 layers"):
        EmbedOptions(layers=7).resolved(n_layers=6, max_positions=32)
    with pytest.raises(EmbeddingError, match=r"max_len=33 must be in \[3, 32\]"):
        EmbedOptions(max_len=33).resolved(n_layers=6, max_positions=32)
    with pytest.raises(EmbeddingError, match=r"stride=31 must be in \[1, 30\]"):
        EmbedOptions(stride=31).resolved(n_layers=6, max_positions=32)


def test_embedder_resolves_folder_defaults_but_explicit_choices_win(tiny_model, tmp_path):
    folder = tmp_path / "trained"
    shutil.copytree(tiny_model, folder)
    (folder / "embedding.json").write_text(json.dumps({"pooling": "max", "layers": [1], "max_len": 16}))
    emb = Embedder(folder)
    assert (emb.pooling, emb.layers, emb.window, emb.stride) == ("max", (1,), 16, 10)
    assert emb.options == EmbedOptions(pooling="max", layers=(1,), normalize=True, max_len=16, stride=10,
                                       device=emb.device)
    mine = Embedder(folder, EmbedOptions(pooling="cls", layers=-1), max_len=32)
    assert (mine.pooling, mine.layers, mine.window) == ("cls", (2,), 32)
    (folder / "embedding.json").write_text(json.dumps({"max_len": 64}))  # beyond the 32 positions: cut
    assert Embedder(folder).window == 32
    with pytest.raises(EmbeddingError, match=r"max_len=64 must be in \[3, 32\]"):
        Embedder(folder, max_len=64)  # an explicit choice is never cut


def test_keyword_api_maps_onto_options(tiny_model):
    texts = ["the def statement defines a function", "classes and objects"]
    by_keyword = qkv.embed(tiny_model, texts, pooling="cls", layers=(-2, -1), normalize=False)
    by_options = qkv.embed(tiny_model, texts, options=EmbedOptions(pooling="cls", layers=(-2, -1),
                                                                   normalize=False))
    np.testing.assert_array_equal(by_keyword, by_options)
    mixed = qkv.embed(tiny_model, texts, EmbedOptions(pooling="max", normalize=False), pooling="cls",
                      layers=(-2, -1))  # keywords change the options given
    np.testing.assert_array_equal(mixed, by_keyword)
    assert not np.allclose(by_keyword, qkv.embed(tiny_model, texts))
    emb = Embedder(tiny_model, pooling="cls", batch_size=1)
    assert emb.options.pooling == "cls" and emb.batch_size == 1
    assert as_options(None, pooling="cls") == EmbedOptions().replace(pooling="cls")
    assert as_options(None, default=EmbedOptions(empty="skip")).empty == "skip"


def test_keyword_api_errors_are_one_line(tiny_model):
    with pytest.raises(EmbeddingError) as info:
        qkv.embed(tiny_model, ["x"], pooing="cls")
    message = str(info.value)
    assert message.startswith("unknown embedding option 'pooing' (did you mean pooling?)")
    assert "\n" not in message
    assert "allowed: pooling, layers, normalize, max_len, stride, truncate, empty" in message
    with pytest.raises(EmbeddingError, match="unknown embedding option 'window'"):
        Embedder(tiny_model, window=16)
    with pytest.raises(EmbeddingError, match="options must be an EmbedOptions, got dict"):
        qkv.embed(tiny_model, ["x"], {"pooling": "cls"})


def test_index_records_the_resolved_options_and_reads_old_ones(tiny_model, tmp_path):
    from qkv.embeddings.search import build_index, index_options, search

    meta = build_index(tiny_model, [(i, f"text number {i}") for i in range(4)], tmp_path / "idx",
                       options=EmbedOptions(pooling="max", empty="error", normalize=False), max_len=24)
    # the same keys (and order) as before EmbedOptions: indexes stay readable both ways
    assert meta["embedding"] == {"pooling": "max", "layers": [2], "normalize": True, "max_len": 24,
                                 "stride": 16, "truncate": False}
    assert index_options(meta) == EmbedOptions(pooling="max", layers=(2,), normalize=True, max_len=24,
                                               stride=16)
    old = {"format": "qkv-embedding-index", "embedding": {"pooling": "mean", "layers": [2], "normalize": True,
                                                          "max_len": 32, "stride": 22, "truncate": True}}
    assert index_options(old) == EmbedOptions(pooling="mean", layers=(2,), normalize=True, max_len=32,
                                              stride=22, truncate=True)
    del old["embedding"]["stride"]
    with pytest.raises(EmbeddingError, match=r"index.json: no stride in its embedding options; the index is "
                                             "damaged"):
        index_options(old, tmp_path / "idx")
    hits = search(tmp_path / "idx", "text number 2", k=1)
    assert hits[0][0].id == 2


def _parse(argv):
    from qkv.cli import build_parser

    return build_parser().parse_args(argv)


def test_the_command_line_builds_one_options_object(tiny_model, tmp_path):
    from qkv.embeddings.cli import _options

    args = _parse(["embed", "m", "in.txt", "--out", "v.npy", "--pooling", "cls", "--layers", "-2", "-1",
                   "--no-normalize", "--batch-size", "4", "--max-len", "24", "--stride", "8", "--truncate",
                   "--empty", "zero", "--device", "cpu", "--no-progress", "--chunk-size", "7"])
    assert _options(args) == EmbedOptions(pooling="cls", layers=(-2, -1), normalize=False, batch_size=4,
                                          max_len=24, stride=8, truncate=True, empty="zero", device="cpu",
                                          progress=False, chunk_size=7)
    index = _parse(["index", "m", "c.txt", "--out", "ix"])
    assert _options(index) == EmbedOptions(empty="skip", progress=True)
    ev = _parse(["eval-embeddings", "m", "--dataset", "reuters8", "--max-len", "24", "--batch-size", "3"])
    assert _options(ev, empty="zero") == EmbedOptions(max_len=24, batch_size=3, empty="zero", progress=True)
    assert _options(_parse(["search", "ix", "q", "--device", "cpu"])) == EmbedOptions(device="cpu")


def test_bad_options_fail_before_the_model_is_loaded(tmp_path, capsys):
    from qkv.cli import main

    text = tmp_path / "t.txt"
    text.write_text("one document\n", encoding="utf-8")
    code = main(["embed", str(tmp_path / "no-model"), str(text), "--out", str(tmp_path / "v.npy"),
                 "--batch-size", "0"])
    assert code == 2 and "batch_size=0 must be an int ≥ 1" in capsys.readouterr().err
    assert not (tmp_path / "v.npy").exists()
