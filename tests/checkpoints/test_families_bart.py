"""BART in and out: parity with transformers' BartForConditionalGeneration (logits over a
right-padded batch, ``generate`` greedy and with 4 beams token for token), the round trip back to
transformers, and refusals."""

import json

import pytest
import torch
from families_support import batch, perturb

import qkv
from qkv.checkpoints.io import export_hf
from qkv.errors import CheckpointError
from qkv.models.seq2seq import EncoderDecoder

transformers = pytest.importorskip("transformers")

# distinct sizes: C 24, H 3, encoder 2 layers, decoder 3, F 40, V 97, P 40 (+2 rows)
V = 97
SIZES = dict(vocab_size=V, d_model=24, encoder_layers=2, decoder_layers=3, encoder_attention_heads=3,
             decoder_attention_heads=3, encoder_ffn_dim=40, decoder_ffn_dim=40, max_position_embeddings=40,
             pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
             forced_bos_token_id=None, no_repeat_ngram_size=0, activation_function="gelu")


def _folder(tmp_path, seed=0, **overrides):
    torch.manual_seed(seed)
    hf = perturb(transformers.BartForConditionalGeneration(transformers.BartConfig(**{**SIZES, **overrides})), seed)
    with torch.no_grad():
        hf.final_logits_bias.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed))
    hf.save_pretrained(tmp_path / "bart")
    return hf.eval(), tmp_path / "bart"


def _decoder_ids(seed=1, shape=(5, 6)):
    return torch.randint(3, V, shape, generator=torch.Generator().manual_seed(seed))


def test_bart_logits_match_transformers_on_a_right_padded_batch(tmp_path):
    hf, folder = _folder(tmp_path)
    model = qkv.load(folder).model.eval()
    assert isinstance(model, EncoderDecoder) and model.config.family == "bart"
    assert model.config.positions.offset == 2 and model.config.norm.embeddings
    ids, mask, _ = batch(V, 1)
    dec = _decoder_ids()
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        ours = model(ids, mask, decoder_input_ids=dec).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("beams", [1, 4])
def test_bart_generate_matches_transformers_token_for_token(tmp_path, beams):
    hf, folder = _folder(tmp_path)
    model = qkv.load(folder).model.eval()
    ids, mask, _ = batch(V, 1)
    theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=10, num_beams=beams, do_sample=False)
    ours = model.generate(ids, mask, max_new_tokens=10, num_beams=beams, pad_token_id=1)
    assert ours.tolist() == theirs.tolist()
    assert len({tuple(r) for r in ours.tolist()}) > 1


def test_bart_export_round_trips_through_transformers(tmp_path):
    hf, folder = _folder(tmp_path)
    model = qkv.load(folder).model.eval()
    out = export_hf(model, tmp_path / "back")
    again = transformers.BartForConditionalGeneration.from_pretrained(out).eval()
    ids, mask, _ = batch(V, 1)
    dec = _decoder_ids()
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        b = again(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert json.loads((out / "config.json").read_text())["model_type"] == "bart"


def test_bart_refuses_different_encoder_decoder_heads(tmp_path):
    _, folder = _folder(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "decoder_attention_heads": 4}))
    with pytest.raises(CheckpointError, match="decoder_attention_heads"):
        qkv.load(folder)
