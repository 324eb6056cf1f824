"""The tied output head in bf16 and int8 (``LinearMaps.vocab_proj``): its own copy of the token table in
the precision it runs in, filled as the state loads, checked against the product written out by hand;
masked-LM logits within the precision's bound of float32; the prepared model's state is a float model's;
its weights take less memory than the float32 model's."""

from __future__ import annotations

import pytest
import torch

from qkv.config import ModelConfig
from qkv.hardware import precision_unsupported
from qkv.inference import for_inference
from qkv.models.builders import build_causal_lm, build_masked_lm
from qkv.nn.linear import InferenceLinear, Int8Linear
from qkv.nn.maps import LinearMaps

CPU = torch.device("cpu")
#: Largest |log p − log p_fp32| over the vocabulary (the bounds of docs/generation.md and docs/inference.md).
BOUNDS = {"bf16": 0.05, "int8": 0.1}


def _skip_unless_offered(precision):
    why = precision_unsupported(precision, CPU)
    if why is not None:
        pytest.skip(f"{precision} not offered here: {why}")


def _mlm():
    torch.manual_seed(0)
    cfg = ModelConfig.from_flat(vocab_size=97, d_model=24, n_heads=3, d_ff=40, n_layers=2, max_len=16, dropout=0.0,
                                attention_dropout=0.0)
    return build_masked_lm(cfg).eval()


def _causal():
    torch.manual_seed(0)
    cfg = ModelConfig.preset("gpt2", vocab_size=101, n_layers=2, d_model=32, n_heads=4, d_ff=56, max_len=16,
                             dropout=0.0)
    return build_causal_lm(cfg).eval()


def weight_bytes(model) -> int:
    """Bytes of a model's parameters and buffers, an int8 map's packed weight counted as one byte per
    entry plus a float32 scale per row."""
    total = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    for m in model.modules():
        if isinstance(m, Int8Linear):
            total += m.out_features * m.in_features + 4 * m.out_features
    return total


def test_training_and_fp32_heads_multiply_by_the_table_itself():
    for maps in (LinearMaps(), LinearMaps("fp32")):
        assert maps.vocab_proj(24, 97) is None
    assert _mlm().head.vocab_proj is None and _causal().vocab_proj is None
    assert for_inference(_causal(), "fp32").vocab_proj is None


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_the_head_map_is_filled_from_the_table(precision):
    _skip_unless_offered(precision)
    model = _causal()
    prepared = for_inference(model, precision, smoothing=None)
    proj = prepared.vocab_proj
    table = model.decoder.embeddings.tokens.weight.detach()  # (V,C)
    h = torch.randn(5, 32, generator=torch.Generator().manual_seed(3))  # (N,C)
    got = prepared.logits(h)
    assert got.dtype == torch.float32 and got.shape == (5, 101)
    if precision == "bf16":
        assert isinstance(proj, InferenceLinear) and proj.weight.dtype == torch.bfloat16
        assert torch.equal(proj.weight, table.bfloat16())
        hand = (h.bfloat16().double() @ table.bfloat16().double().T).float()  # (N,C)(C,V) -> (N,V)
        torch.testing.assert_close(got, hand, atol=0.02, rtol=0.01)  # one bf16 rounding of the output
    else:
        assert isinstance(proj, Int8Linear) and proj.inv_scale is None
        step = table.abs().amax(dim=1, keepdim=True) / 127  # (V,1): one scale per row
        assert (proj.weight - table).abs().le(step / 2 + 1e-7).all()  # each entry within half a step
        hand = h @ table.T  # (N,C)(C,V) -> (N,V) in float32
        assert (got - hand).abs().max() <= 0.05 * hand.abs().max()
    # the embedding lookup keeps the float32 table
    assert prepared.decoder.embeddings.tokens.weight.dtype == torch.float32


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_masked_lm_logits_within_the_bound(precision):
    """Fill-mask's computation: the encoder, then the head at the masked positions only."""
    _skip_unless_offered(precision)
    model = _mlm()
    prepared = for_inference(model, precision, smoothing=None)
    assert isinstance(prepared.head.vocab_proj, InferenceLinear if precision == "bf16" else Int8Linear)
    ids = torch.randint(1, 97, (5, 11), generator=torch.Generator().manual_seed(1))
    where = torch.rand(5, 11, generator=torch.Generator().manual_seed(2)) < 0.3  # (B,T) "masked" positions
    with torch.no_grad():
        ref = model(ids).logits[where].log_softmax(-1)  # (M,V)
        h = prepared.encoder(ids).last_hidden_state[where]  # (M,C)
        got = prepared.head(h, prepared.decoder_weight).log_softmax(-1)  # (M,V)
        # the whole batch through the head: int8 quantises another input (its scale is the batch's)
        whole = prepared(ids).logits[where].log_softmax(-1)  # (B,T,V) -> (M,V)
    assert got.dtype == torch.float32
    assert (got - ref).abs().max().item() <= BOUNDS[precision]
    assert (whole - ref).abs().max().item() <= BOUNDS[precision]


@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.parametrize("build", [_mlm, _causal])
def test_the_prepared_state_is_a_float_models(precision, build):
    _skip_unless_offered(precision)
    model = build()
    prepared = for_inference(model, precision, smoothing=None)
    state = prepared.state_dict()
    assert set(state) == set(model.state_dict())  # no vocab_proj entry: it saves as the float model
    again = build()
    again.load_state_dict(state)  # a plain model loads it
    proj = prepared.head.vocab_proj if hasattr(prepared, "head") else prepared.vocab_proj
    assert proj.weight.shape == (model.config.vocab_size, model.config.d_model)


@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.parametrize("build", [_mlm, _causal])
def test_the_head_copy_does_not_grow_the_model(precision, build):
    """The copy of the table (V·C bf16 or int8 bytes) is paid for by the layers' smaller weights."""
    _skip_unless_offered(precision)
    model = build()
    prepared = for_inference(model, precision, smoothing=None)
    assert weight_bytes(prepared) < weight_bytes(model)
    float32_tables = [t for t in list(prepared.parameters()) + list(prepared.buffers())
                      if t.dtype == torch.float32 and t.shape == (model.config.vocab_size, model.config.d_model)]
    assert len(float32_tables) == 1  # the embedding's table only: no second float32 copy
