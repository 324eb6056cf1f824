"""T5 in and out: parity with transformers' T5ForConditionalGeneration (logits over a right-padded
batch, ``generate`` greedy and with 4 beams token for token), the round trip back to transformers,
and refusals."""

import json

import pytest
import torch
from families_support import batch, perturb

import qkv
from qkv.checkpoints.io import export_hf
from qkv.errors import CheckpointError
from qkv.models.seq2seq import EncoderDecoder

transformers = pytest.importorskip("transformers")

# distinct sizes: C 24, H 3 (d_kv 8), 2 + 2 layers (transformers' T5 cache wants equal depths), F 40, V 97, K 8
V = 97
SIZES = dict(vocab_size=V, d_model=24, d_kv=8, d_ff=40, num_layers=2, num_decoder_layers=2, num_heads=3,
             relative_attention_num_buckets=8, relative_attention_max_distance=20, feed_forward_proj="relu",
             pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


def _folder(tmp_path, seed=0, **overrides):
    torch.manual_seed(seed)
    hf = perturb(transformers.T5ForConditionalGeneration(transformers.T5Config(**{**SIZES, **overrides})), seed)
    hf.save_pretrained(tmp_path / "t5")
    return hf.eval(), tmp_path / "t5"


def _decoder_ids(seed=1, shape=(5, 6)):
    return torch.randint(2, V, shape, generator=torch.Generator().manual_seed(seed))


def test_t5_logits_match_transformers_on_a_right_padded_batch(tmp_path):
    hf, folder = _folder(tmp_path)
    model = qkv.load(folder).model.eval()
    assert isinstance(model, EncoderDecoder) and model.config.family == "t5"
    ids, mask, _ = batch(V, 0)
    dec = _decoder_ids()
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        ours = model(ids, mask, decoder_input_ids=dec).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("beams", [1, 4])
def test_t5_generate_matches_transformers_token_for_token(tmp_path, beams):
    hf, folder = _folder(tmp_path)
    model = qkv.load(folder).model.eval()
    ids, mask, _ = batch(V, 0)
    theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=10, num_beams=beams, do_sample=False)
    ours = model.generate(ids, mask, max_new_tokens=10, num_beams=beams)
    assert ours.tolist() == theirs.tolist()
    assert len({tuple(r) for r in ours.tolist()}) > 1


def test_t5_export_round_trips_through_transformers(tmp_path):
    hf, folder = _folder(tmp_path)
    model = qkv.load(folder).model.eval()
    out = export_hf(model, tmp_path / "back")
    again = transformers.T5ForConditionalGeneration.from_pretrained(out).eval()
    ids, mask, _ = batch(V, 0)
    dec = _decoder_ids()
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        b = again(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert json.loads((out / "config.json").read_text())["model_type"] == "t5"


def test_t5_refuses_gated_feed_forward_and_untied_heads(tmp_path):
    _, folder = _folder(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "feed_forward_proj": "gated-gelu"}))
    with pytest.raises(CheckpointError, match="gated"):
        qkv.load(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    with pytest.raises(CheckpointError, match="untied head"):
        qkv.load(folder)
