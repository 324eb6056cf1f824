"""ONNX export: the file run in ONNX Runtime against qkv and against a Hugging Face BertModel built
locally with random weights (the independent reference), at batch sizes and lengths other than the
export sample's, padded; the real MiniLM checkpoint; refusals; the command line; no file left on a
failed check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import qkv  # noqa: E402
from qkv.cli import main  # noqa: E402
from qkv.checkpoints.onnx import ExportError, export_onnx  # noqa: E402


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=97, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                     intermediate_size=40, max_position_embeddings=32, type_vocab_size=2)
    folder = tmp_path_factory.mktemp("hf") / "bert"
    BertModel(cfg).eval().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def exported(hf_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx") / "bert.onnx"
    return export_onnx(hf_folder, out)


def _feeds(B, T, seed):
    g = np.random.default_rng(seed)
    ids = g.integers(1, 97, (B, T))
    lengths = g.integers(1, T + 1, B)
    lengths[0] = T
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int64)
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


@pytest.mark.parametrize("B,T", [(1, 3), (4, 17), (2, 32)])
def test_onnx_matches_qkv_and_transformers(hf_folder, exported, B, T):
    from transformers import BertModel

    assert exported.max_diff is not None and exported.max_diff <= 1e-4
    assert set(exported.inputs) == {"input_ids", "attention_mask", "token_type_ids"}
    feeds = _feeds(B, T, seed=B * 100 + T)
    sess = ort.InferenceSession(str(exported.path), providers=["CPUExecutionProvider"])
    out = sess.run(None, feeds)[0]  # (B,T,C)
    real = feeds["attention_mask"].astype(bool)
    hf = BertModel.from_pretrained(str(hf_folder)).eval()
    model, _ = qkv.load(hf_folder)
    t = {k: torch.from_numpy(v) for k, v in feeds.items()}
    with torch.inference_mode():
        ref_hf = hf(**t).last_hidden_state.numpy()
        ref_qkv = model(t["input_ids"], t["attention_mask"].bool(), t["token_type_ids"]).last_hidden_state.numpy()
    assert np.abs(out - ref_hf)[real].max() <= 1e-4
    assert np.abs(out - ref_qkv)[real].max() <= 1e-4


def test_refusals(hf_folder, exported, tmp_path):
    with pytest.raises(ExportError, match="exists"):
        export_onnx(hf_folder, exported.path)
    from qkv.config import ModelConfig
    from qkv.models.builders import build_encoder

    enc = build_encoder(ModelConfig.from_flat(vocab_size=97, d_model=24, n_heads=3, d_ff=40, n_layers=1, max_len=16,
                                    position="alibi"))
    with pytest.raises(ExportError, match="alibi"):
        export_onnx(enc, tmp_path / "a.onnx")
    assert not (tmp_path / "a.onnx").exists()


def test_failed_check_leaves_no_file(hf_folder, tmp_path):
    with pytest.raises(ExportError, match="check failed"):
        export_onnx(hf_folder, tmp_path / "b.onnx", atol=0.0 - 1.0)
    assert list(tmp_path.iterdir()) == []


def test_cli(hf_folder, tmp_path, capsys):
    out = tmp_path / "c.onnx"
    assert main(["export", str(hf_folder), "--onnx", str(out)]) == 0
    text = capsys.readouterr().out
    assert "wrote" in text and "max |diff|" in text and out.is_file()


def test_embeddings_pipeline_equals_qkv_embed(tiny_model, tmp_path):
    """Pooling and normalisation inside the graph: ONNX Runtime gives qkv.embed's vectors; the output's
    folder is created when missing."""
    out = tmp_path / "new" / "folder" / "emb.onnx"
    assert main(["export", str(tiny_model), "--onnx", str(out), "--pipeline", "embeddings", "--pooling",
                 "cls+mean"]) == 0
    model, tok = qkv.load(tiny_model)
    texts = ["a short text", "a somewhat longer text about functions and modules", "x"]
    batch = tok(texts, return_tensors="np")
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [o.name for o in sess.get_outputs()] == ["sentence_embedding"]
    feeds = {k: v for k, v in batch.items() if k in {i.name for i in sess.get_inputs()}}
    if "token_type_ids" in {i.name for i in sess.get_inputs()}:
        feeds["token_type_ids"] = np.zeros_like(batch["input_ids"])
    got = sess.run(None, feeds)[0]
    np.testing.assert_allclose(got, qkv.embed(tiny_model, texts, pooling="cls+mean"), atol=1e-4)
    with pytest.raises(ExportError, match="pipeline='rerank' is not allowed; allowed: encoder, embeddings"):
        export_onnx(tiny_model, tmp_path / "r.onnx", pipeline="rerank")


@pytest.mark.parametrize("kind", ["sequence", "token"])
def test_classifier_pipeline_equals_transformers(tmp_path, bpe_tok, kind):
    from bpe_support import roberta_folder

    hf = roberta_folder(tmp_path / "hf", bpe_tok, kind)
    r = export_onnx(tmp_path / "hf", tmp_path / "c.onnx", pipeline="classifier")
    assert r.output == "logits" and r.max_diff <= 1e-4
    tok = qkv.load(tmp_path / "hf").tokenizer
    batch = tok(["The cat sat on the mat.", "Return"], return_tensors="np")
    sess = ort.InferenceSession(str(r.path), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if "token_type_ids" in {i.name for i in sess.get_inputs()}:
        feeds["token_type_ids"] = np.zeros_like(batch["input_ids"])
    got = sess.run(None, feeds)[0]
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(batch["input_ids"]),
                  attention_mask=torch.from_numpy(batch["attention_mask"])).logits.numpy()
    real = batch["attention_mask"].astype(bool)
    np.testing.assert_allclose(got[real] if kind == "token" else got, want[real] if kind == "token" else want,
                               atol=1e-4)
    with pytest.raises(ExportError, match="pipeline 'causal-lm' needs a causal language model, got"):
        export_onnx(tmp_path / "hf", tmp_path / "x.onnx", pipeline="causal-lm")


def test_causal_lm_pipeline_equals_qkv(tmp_path):
    from qkv.config import ModelConfig
    from qkv.models.builders import build_causal_lm

    torch.manual_seed(0)
    model = build_causal_lm(ModelConfig.preset("gpt2", vocab_size=61, d_model=24, n_heads=3, d_ff=40, n_layers=2,
                                               max_len=20)).eval()
    r = export_onnx(model, tmp_path / "lm.onnx", pipeline="causal-lm")
    assert r.inputs == ("input_ids", "attention_mask") and r.max_diff <= 1e-4
    ids = torch.randint(0, 61, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    sess = ort.InferenceSession(str(r.path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    with torch.no_grad():
        want = model(ids, mask).logits.numpy()
    np.testing.assert_allclose(got[mask.bool().numpy()], want[mask.bool().numpy()], atol=1e-4)
