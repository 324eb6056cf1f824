"""sentence-transformers folders both ways, against sentence-transformers itself (offline).

Reading: a small random BERT with a Pooling module (every mode, several at once, the legacy
``pooling_mode_*`` form) and optional Normalize, saved by ``SentenceTransformer.save``; ``qkv.embed``
of the folder equals ``SentenceTransformer.encode`` on texts within the window. Writing: ``convert
--to sentence-transformers`` (and ``train-embeddings``) folders load in sentence-transformers with
qkv's vectors. Refusals: modules and pooling options qkv cannot reproduce.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import qkv
from qkv.cli import main
from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.embedder import Embedder
from qkv.embeddings.options import EmbedOptions
from qkv.checkpoints.convert import convert

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
st = pytest.importorskip("sentence_transformers")

TEXTS = ["the cat sat on the mat", "a dog", "functions and classes are objects in python",
         "x", "the import statement binds a name"]  # each within the tiny model's 24-token windows
WIDTH = 32


@pytest.fixture(scope="module")
def bert_dir(tiny_model, tmp_path_factory) -> Path:
    """A random Hugging Face BertModel (32 wide, 2 layers) with a BERT tokenizer built from the tiny
    model's vocabulary, saved with save_pretrained."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = tmp_path_factory.mktemp("bert") / "bert"
    tok = BertTokenizerFast(vocab_file=str(tiny_model / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, initializer_range=0.2)
    BertModel(cfg, add_pooling_layer=False).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


def _st_folder(bert_dir: Path, out: Path, mode, normalize: bool, max_seq_length: int = 40) -> Path:
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    modules = [Transformer(str(bert_dir), max_seq_length=max_seq_length), Pooling(WIDTH, pooling_mode=mode)]
    modules += [Normalize()] if normalize else []
    st.SentenceTransformer(modules=modules, device="cpu").save(str(out))
    return out


def _encode(folder) -> np.ndarray:
    model = st.SentenceTransformer(str(folder), device="cpu")
    return model.encode(TEXTS, convert_to_numpy=True, batch_size=8)


@pytest.mark.parametrize("mode,normalize", [
    ("cls", True), ("mean", False), ("max", True), ("mean_sqrt_len_tokens", False), ("weightedmean", True),
    ("lasttoken", False), (("cls", "mean"), True), (("weightedmean", "max", "lasttoken", "mean"), False)])
def test_qkv_reads_every_pooling_mode_as_sentence_transformers_encodes(bert_dir, tmp_path, mode, normalize):
    folder = _st_folder(bert_dir, tmp_path / "st", mode, normalize)
    ref = _encode(folder)
    modes = (mode,) if isinstance(mode, str) else mode
    assert ref.shape == (len(TEXTS), WIDTH * len(modes))
    got = qkv.embed(folder, TEXTS, device="cpu")
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    emb = Embedder(folder, device="cpu")
    assert (emb.normalize, emb.window, emb.dim) == (normalize, 40, WIDTH * len(modes))


@pytest.mark.parametrize("flags,expected", [
    (("pooling_mode_mean_tokens", "pooling_mode_cls_token", "pooling_mode_max_tokens"), "cls+max+mean"),
    (("pooling_mode_lasttoken", "pooling_mode_weightedmean_tokens", "pooling_mode_mean_sqrt_len_tokens"),
     "mean_sqrt_len+weightedmean+lasttoken"),
    ((), "mean")])  # none set: sentence-transformers pools the mean
def test_legacy_pooling_flags_concatenate_in_sentence_transformers_order(bert_dir, tmp_path, flags, expected):
    from qkv.embeddings.options import folder_defaults

    folder = _st_folder(bert_dir, tmp_path / "st", "mean", True)
    legacy = {"word_embedding_dimension": WIDTH, **{k: True for k in flags}}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(legacy))
    assert folder_defaults(folder)["pooling"] == expected
    np.testing.assert_allclose(qkv.embed(folder, TEXTS, device="cpu"), _encode(folder), atol=1e-5, rtol=0)


def test_max_seq_length_from_the_folder_and_the_tokenizer(bert_dir, tmp_path):
    from qkv.embeddings.options import folder_defaults

    folder = _st_folder(bert_dir, tmp_path / "st", "mean", True, max_seq_length=12)
    assert folder_defaults(folder)["max_len"] == 12  # sentence-transformers 6: tokenizer_config.json
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 9}))
    assert folder_defaults(folder)["max_len"] == 9
    long = ["one two three four five six seven eight nine ten eleven twelve"]
    ref = st.SentenceTransformer(str(folder), device="cpu").encode(long)
    np.testing.assert_allclose(qkv.embed(folder, long, truncate=True, device="cpu"), ref, atol=1e-5, rtol=0)


def test_round_trip_qkv_to_sentence_transformers(tiny_model, tmp_path):
    out = convert(tiny_model, tmp_path / "st", to="sentence-transformers",
                  options=EmbedOptions(pooling=("cls", "weightedmean"), normalize=False, max_len=24))
    assert {"modules.json", "1_Pooling", "sentence_bert_config.json", "config_sentence_transformers.json",
            "config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert not (out / "2_Normalize").exists()
    emb = Embedder(tiny_model, pooling="cls+weightedmean", normalize=False, max_len=24, device="cpu")
    want = emb.embed(TEXTS)
    assert emb.stats.long_documents == 0 and emb.dim == 48  # within the window: no truncation by ST
    np.testing.assert_allclose(_encode(out), want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(qkv.embed(out, TEXTS, device="cpu"), want, atol=1e-6, rtol=0)  # read back
    again = convert(out, out, to="sentence-transformers")  # in place, its declared settings kept
    np.testing.assert_allclose(_encode(again), want, atol=1e-5, rtol=0)


def test_convert_command(tiny_model, tmp_path, capsys):
    out = tmp_path / "st"
    assert main(["convert", str(tiny_model), str(out), "--to", "sentence-transformers",
                 "--pooling", "mean+max", "--max-len", "20"]) == 0
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert pooling == {"embedding_dimension": 24, "pooling_mode": ["mean", "max"], "include_prompt": True}
    assert json.loads((out / "sentence_bert_config.json").read_text()) == {
        "max_seq_length": 20, "do_lower_case": False, "model_args": {"add_pooling_layer": False}}
    want = qkv.embed(tiny_model, TEXTS, pooling="mean+max", max_len=20, device="cpu")
    np.testing.assert_allclose(_encode(out), want, atol=1e-5, rtol=0)
    capsys.readouterr()
    assert main(["convert", str(tiny_model), str(tmp_path / "hf"), "--pooling", "cls"]) == 2
    assert "add --to sentence-transformers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["convert", str(tiny_model), str(tmp_path / "x"), "--to", "sentence-transformers", "--pooling",
              "cls+median"])
    assert "unknown pooling mode 'median'" in capsys.readouterr().err


def test_minilm_round_trip(minilm, tmp_path):
    ref = _encode(minilm)
    np.testing.assert_allclose(qkv.embed(minilm, TEXTS, device="cpu"), ref, atol=1e-5, rtol=0)
    out = convert(minilm, tmp_path / "minilm", to="sentence-transformers")
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 256
    np.testing.assert_allclose(_encode(out), ref, atol=1e-5, rtol=0)
    np.testing.assert_allclose(qkv.embed(out, TEXTS, device="cpu"), ref, atol=1e-5, rtol=0)


def _error(folder) -> str:
    with pytest.raises(EmbeddingError) as info:
        qkv.embed(folder, TEXTS, device="cpu")
    message = str(info.value)
    assert "\n" not in message
    return message


def test_refuses_a_module_it_cannot_run(bert_dir, tmp_path):
    from sentence_transformers.base.modules import Dense, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    folder = tmp_path / "dense"
    modules = [Transformer(str(bert_dir)), Pooling(WIDTH), Dense(WIDTH, 8)]
    st.SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    message = _error(folder)
    assert "module 2" in message and "Dense" in message
    assert "Transformer → Pooling → optional Normalize" in message
    modules = json.loads((folder / "modules.json").read_text())
    modules[2] = {**modules[0], "idx": 2, "name": "2"}  # a second Transformer
    (folder / "modules.json").write_text(json.dumps(modules))
    assert "module 2" in _error(folder) and "Transformer" in _error(folder)
    (folder / "modules.json").write_text(json.dumps(modules[:1]))
    assert "no Pooling module" in _error(folder)
    (folder / "modules.json").write_text(json.dumps([{**modules[0], "path": "0_Transformer"}, modules[1]]))
    assert "the Transformer lives in '0_Transformer'" in _error(folder)


def test_normalize_module_and_lower_casing(bert_dir, tmp_path):
    folder = _st_folder(bert_dir, tmp_path / "st", "mean", True)
    (folder / "2_Normalize" / "config.json").write_text(json.dumps({"module_input_name": "token_embeddings"}))
    assert "Normalize acts on 'token_embeddings'" in _error(folder)
    (folder / "2_Normalize" / "config.json").write_text(json.dumps({}))
    settings = {"max_seq_length": 16, "do_lower_case": True}
    (folder / "sentence_bert_config.json").write_text(json.dumps(settings))
    np.testing.assert_allclose(qkv.embed(folder, TEXTS, device="cpu"), _encode(folder), atol=1e-5, rtol=0)
    tok = json.loads((folder / "tokenizer.json").read_text())  # the tokenizer lower-cases: nothing changes
    tok["normalizer"]["lowercase"] = False
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    assert "do_lower_case is true but the tokenizer does not lower-case" in _error(folder)


@pytest.mark.parametrize("change,fragment", [
    ({"pooling_mode": "median"}, "pooling mode 'median' is not one qkv supports"),
    ({"pooling_mode": ["cls", "attention"]}, "'attention'"),
    ({"pooling_mode_attention": True}, "pooling option 'pooling_mode_attention' is not one qkv supports"),
    ({"embedding_dimension": 64}, "expects 64-wide token vectors but the model is 32 wide")])
def test_refuses_a_pooling_option_it_does_not_support(bert_dir, tmp_path, change, fragment):
    folder = _st_folder(bert_dir, tmp_path / "st", "mean", True)
    cfg = folder / "1_Pooling" / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), **change}))
    assert fragment in _error(folder)


def test_refuses_settings_that_change_the_vectors(bert_dir, tmp_path):
    folder = _st_folder(bert_dir, tmp_path / "st", "mean", True)
    config = folder / "config_sentence_transformers.json"
    config.write_text(json.dumps({"prompts": {"query": "query: "}, "default_prompt_name": "query"}))
    assert "default_prompt_name 'query'" in _error(folder)
    config.write_text(json.dumps({"model_type": "SparseEncoder"}))
    assert "model_type 'SparseEncoder'" in _error(folder)
    config.unlink()
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16, "pad_to": 8}))
    assert "setting 'pad_to' is not one qkv supports" in _error(folder)
    cfg = folder / "1_Pooling" / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "include_prompt": False}))  # no prompt: same
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16}))
    np.testing.assert_allclose(qkv.embed(folder, TEXTS, device="cpu"), _encode(folder), atol=1e-5, rtol=0)


def test_writer_refuses_what_it_cannot_express_and_keeps_user_files(tiny_model, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(EmbeddingError, match=r"holds files that are not part of a model \(notes.txt\)"):
        convert(tiny_model, mine, to="sentence-transformers")
    assert (mine / "notes.txt").read_text() == "keep me" and len(list(mine.iterdir())) == 1
    with pytest.raises(EmbeddingError, match="pools the last layer only"):
        convert(tiny_model, tmp_path / "x", to="sentence-transformers", options=EmbedOptions(layers=(-2, -1)))
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="to='sentence-transformers'"):
        convert(tiny_model, tmp_path / "y", to="hf", options=EmbedOptions(pooling="cls"))


def test_pooling_option_forms():
    assert EmbedOptions(pooling=("cls", "mean")).pooling == "cls+mean"
    assert EmbedOptions(pooling="cls+mean").pooling == "cls+mean"
    assert EmbedOptions(pooling=["weightedmean"]).pooling == "weightedmean"
    for bad, fragment in ((("cls", "median"), "(mode 'median')"), ("", "pooling='' is not allowed"),
                          (3, "pooling must be a mode name")):
        with pytest.raises(EmbeddingError) as info:
            EmbedOptions(pooling=bad)
        assert fragment in str(info.value) and "weightedmean, lasttoken" in str(info.value)


def test_train_embeddings_output_loads_in_sentence_transformers(tiny_model, tmp_path):
    from qkv.embeddings.contrastive import train_embeddings
    from qkv.embeddings.contrastive_config import ContrastiveConfig

    texts = [f"document {i} about {'cats' if i % 2 else 'dogs'} and more" for i in range(12)]
    out = tmp_path / "trained"
    train_embeddings(tiny_model, texts, out, ContrastiveConfig(steps=1, batch_size=4, max_len=16,
                                                               pooling="cls+mean"), device="cpu")
    np.testing.assert_allclose(_encode(out), qkv.embed(out, TEXTS, device="cpu"), atol=1e-5, rtol=0)
    assert json.loads((out / "embedding.json").read_text())["pooling"] == "cls+mean"
    with pytest.raises(EmbeddingError, match="--format qkv"):
        train_embeddings(tiny_model, texts, tmp_path / "t2", ContrastiveConfig(steps=1, layers=(-2, -1)))
    assert not (tmp_path / "t2").exists()
    shutil.rmtree(out)


@pytest.mark.parametrize("family", ["roberta", "distilbert", "electra", "modernbert"])
def test_round_trip_of_other_families(tiny_model, tmp_path, family):
    """An encoder of each family (the tiny model's tokenizer) written as a sentence-transformers
    folder: sentence-transformers builds that family's model from it, with qkv's vectors."""
    from qkv.config import ModelConfig
    from qkv.models.builders import build_encoder

    tok = qkv.load(tiny_model).tokenizer
    sizes = dict(vocab_size=tok.get_vocab_size(), d_model=24, n_heads=3, d_ff=40, n_layers=2, max_len=32)
    config = {"roberta": lambda: ModelConfig.from_flat(**sizes, family="roberta", position_offset=1),
              "distilbert": lambda: ModelConfig.from_flat(**sizes, family="distilbert", type_vocab_size=0),
              "electra": lambda: ModelConfig.from_flat(**sizes, family="electra", embedding_size=16),
              "modernbert": lambda: ModelConfig.preset("modernbert", **{**sizes, "n_layers": 4}, pad_token_id=0,
                                                       local_window=4)}[family]()
    torch.manual_seed(0)
    qkv.save(build_encoder(config), tmp_path / "qkv", tokenizer=tok)
    out = convert(tmp_path / "qkv", tmp_path / "st", to="sentence-transformers")
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    want = qkv.embed(tmp_path / "qkv", TEXTS, device="cpu")
    np.testing.assert_allclose(_encode(out), want, atol=1e-5, rtol=0)
