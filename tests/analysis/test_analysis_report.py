"""End to end: analyse a tiny random BERT over real text, write the report; the CLI on a model folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from analysis_support import MAX_LEN, N_HEADS, N_LAYERS, pydoc_texts, qkv_load_unavailable

from qkv.analysis.analyze import analyze
from qkv.analysis.analyze import AnalyzeOptions
from qkv.analysis.inputs import AnalysisInputError, Documents
from qkv.analysis.report import write_report
from qkv.analysis.heads import HEAD_METRICS

FAST = {"max_len": MAX_LEN, "token_sample": 600, "probe_top_tokens": 10, "max_word_types": 60, "batch_size": 8}


def _docs(n=24):
    texts = [t[:700] for t in pydoc_texts(n)]
    return Documents(texts, ["even" if i % 2 == 0 else "odd" for i in range(n)], "pydoc")


def test_analyze_api_returns_all_statistics_and_writes_a_self_contained_report(
    tiny_hf_model, tiny_tokenizer, tmp_path
):
    r = analyze(tiny_hf_model, tiny_tokenizer, _docs(), AnalyzeOptions(**FAST), model_name="tiny")
    ls, hs = r.layers, r.heads
    assert (r.n_layers, r.n_heads, r.d_model) == (N_LAYERS, N_HEADS, 24)
    for name in ("anisotropy", "self_similarity", "intra_similarity", "mean_norm"):
        v = getattr(ls, name)
        assert v.shape == (N_LAYERS + 1,) and np.isfinite(v).all(), name
    assert ls.cka.shape == (N_LAYERS + 1, N_LAYERS + 1)
    np.testing.assert_allclose(np.diag(ls.cka), 1.0)
    assert set(ls.probes) == {"token", "position", "label"}
    for p in ls.probes.values():
        assert p.accuracy.shape == (N_LAYERS + 1,) and ((0 <= p.accuracy) & (p.accuracy <= 1)).all()
    assert ls.probes["token"].accuracy[0] > 0.9  # the embedding layer knows its token
    for name in HEAD_METRICS:
        assert hs.metric(name).shape == (N_LAYERS, N_HEADS)
    assert 0 < hs.entropy.mean() < hs.uniform_entropy + 1e-6
    assert ls.n_word_types > 0 and r.n_contexts > len(_docs())  # long texts were windowed

    paths = write_report(r, tmp_path / "rep")
    for key in ("layers", "probes", "cka", "heads", "heads_by_layer"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = paths["html"].read_text()
    assert page.count("data:image/png;base64,") == 5
    for remote in ('src="http', "href=\"http", "<link", "<script src", "@import", "url("):
        assert remote not in page
    data = json.loads(paths["json"].read_text())
    assert data["layers"]["anisotropy"] == pytest.approx(ls.anisotropy.tolist())
    assert np.array(data["heads"]["cls_share"]).shape == (N_LAYERS, N_HEADS)
    md = paths["md"].read_text()
    assert "![" in md and "| layer |" in md

    # the plain-language summary opens the report, each sentence from a number of the result
    from qkv.analysis.summary import summarize

    lines = summarize(r)
    ent = hs.entropy.mean(1)
    assert f"Attention is broadest in L{int(np.argmax(ent))} (mean entropy {ent.max():.2f} nats" in " ".join(lines)
    assert md.index("## In short") < md.index("## ", md.index("## In short") + 3)
    assert all(line in md for line in lines)
    assert r.notes == ["head ablation: needs a qkv model (load the folder with qkv.load)"]  # transformers' model


def test_analyze_errors_clearly_on_an_empty_corpus(tiny_hf_model, tiny_tokenizer):

    with pytest.raises(AnalysisInputError, match="empty"):
        analyze(tiny_hf_model, tiny_tokenizer, Documents([]), AnalyzeOptions(**FAST))
    with pytest.raises(AnalysisInputError, match="single context"):
        analyze(tiny_hf_model, tiny_tokenizer, Documents(["one short text"]), AnalyzeOptions(**FAST))
    with pytest.raises(AnalysisInputError, match="exceeds the model's window"):
        analyze(tiny_hf_model, tiny_tokenizer, _docs(), AnalyzeOptions(**{**FAST, "max_len": 64}))


@pytest.mark.skipif(qkv_load_unavailable() is not None, reason=str(qkv_load_unavailable()))
def test_cli_analyze_and_inspect_on_a_model_folder(tiny_hf_folder, tiny_hf_model, tiny_tokenizer, tmp_path, capsys):
    from qkv.cli import main

    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(t.replace("\n", " ") for t in _docs().texts), encoding="utf-8")
    out = tmp_path / "report"
    rc = main(["analyze", str(tiny_hf_folder), "--corpus", str(corpus), "--out", str(out),
               "--max-len", str(MAX_LEN), "--token-sample", "600", "--quiet"])
    assert rc == 0, capsys.readouterr().err
    for name in ("report.html", "report.md", "analysis.json", "cka.png", "heads.png", "layers.png"):
        assert (out / name).stat().st_size > 0
    # qkv.load's model and transformers' give the same statistics on the same corpus
    data = json.loads((out / "analysis.json").read_text())
    ref = analyze(tiny_hf_model, tiny_tokenizer, Documents(corpus.read_text().splitlines()),
                  AnalyzeOptions(max_len=MAX_LEN, token_sample=600))
    np.testing.assert_allclose(data["heads"]["entropy"], ref.heads.entropy, rtol=1e-4)
    np.testing.assert_allclose(data["layers"]["anisotropy"], ref.layers.anisotropy, rtol=1e-4, atol=1e-6)

    md = (out / "report.md").read_text()
    assert md.index("## In short") < md.index("## Heads switched off one at a time") < md.index(
        "## Parity with the original model")
    assert len(data["ablation"]["effects"]) == N_LAYERS and data["parity"]["attention_diff"] < 1e-4
    assert "parity with transformers" in capsys.readouterr().out

    rc = main(["inspect", str(tiny_hf_folder), "the cat sat on the mat", "--pair", "it slept",
               "--out", str(tmp_path / "ins"), "--format", "png,svg"])
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "L0H0" in printed and "parity with transformers" in printed
    assert (tmp_path / "ins" / "viewer.html").is_file()
    assert sorted(p.name for p in (tmp_path / "ins").glob("attention_layer_*.png")) == [
        f"attention_layer_{i}.png" for i in range(N_LAYERS)]  # layers numbered from 0, as everywhere
    for name in ("attention_overview.svg", "methods.svg", "ablation.svg", "methods.png"):
        assert (tmp_path / "ins" / name).stat().st_size > 0

    rc = main(["inspect", str(tiny_hf_folder), "the cat sat on the mat", "--similar-to", "a cat on a mat",
               "--out", str(tmp_path / "sim"), "--format", "svg"])
    assert rc == 0, capsys.readouterr().err
    sim = json.loads((tmp_path / "sim" / "similarity.json").read_text())
    assert np.sum(sim["contributions"]) == pytest.approx(sim["cosine"], abs=1e-5)
    assert f"cosine {sim['cosine']:.4f}" in capsys.readouterr().out
    assert (tmp_path / "sim" / "similarity.svg").is_file()

    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "no-such-model"), "--corpus", str(corpus), "--out",
                 str(tmp_path / "x"), "--quiet"]) == 2
    assert "no-such-model" in capsys.readouterr().err
    (tmp_path / "not-a-model").mkdir()
    assert main(["inspect", str(tmp_path / "not-a-model"), "text", "--out", str(tmp_path / "x")]) == 2
    assert "cannot load a model" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert main(["analyze", str(tiny_hf_folder), "--corpus", str(empty), "--out", str(tmp_path / "y"),
                 "--max-len", str(MAX_LEN), "--quiet"]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["inspect", str(tiny_hf_folder), " ".join(pydoc_texts(1)), "--out", str(tmp_path / "z")]) == 2
    assert "window" in capsys.readouterr().err


@pytest.mark.skipif(qkv_load_unavailable() is not None, reason=str(qkv_load_unavailable()))
@pytest.mark.parametrize("precision, entropy_tol", [("bf16", 0.01), ("int8", 0.03)])
def test_analysis_in_a_reduced_precision_stays_close_to_float32(tiny_hf_folder, precision, entropy_tol):
    import qkv
    from qkv.hardware import precision_unsupported

    if precision_unsupported(precision, torch.device("cpu")) is not None:
        pytest.skip(precision_unsupported(precision, torch.device("cpu")))
    bundle = qkv.load(tiny_hf_folder)
    ref = analyze(bundle.model, bundle.tokenizer, _docs(), AnalyzeOptions(**FAST))
    got = analyze(bundle.model, bundle.tokenizer, _docs(), AnalyzeOptions(**FAST, precision=precision))
    assert got.options.precision == precision and ref.options.precision == "fp32"
    np.testing.assert_allclose(got.heads.entropy, ref.heads.entropy, atol=entropy_tol)
    np.testing.assert_allclose(got.heads.cls_share, ref.heads.cls_share, atol=entropy_tol)
    np.testing.assert_allclose(got.layers.anisotropy, ref.layers.anisotropy, atol=0.01)
    assert not np.array_equal(got.heads.entropy, ref.heads.entropy)  # it did run in another precision
    assert all(isinstance(m, torch.nn.Linear) for m in bundle.model.modules() if "Linear" in type(m).__name__)


def test_a_reduced_precision_needs_a_qkv_model(tiny_hf_model, tiny_tokenizer):
    with pytest.raises(AnalysisInputError, match="precision 'bf16' needs a qkv model, got BertModel"):
        analyze(tiny_hf_model, tiny_tokenizer, _docs(), AnalyzeOptions(**FAST, precision="bf16"))
    with pytest.raises(AnalysisInputError, match="precision='fp16' is not allowed"):
        AnalyzeOptions(precision="fp16")
