"""The parity report of a converted Hugging Face folder: qkv's numbers against transformers' own."""

from __future__ import annotations

import pytest

from qkv.analysis.hooked import encode_texts
from qkv.analysis.parity import hf_parity
from qkv.checkpoints.io import load

TEXTS = ["the cat sat on the mat", "then it slept"]


def test_a_converted_bert_folder_matches_transformers(tiny_hf_folder):
    pytest.importorskip("transformers")
    model, tok = load(tiny_hf_folder)
    batch = encode_texts(tok, TEXTS, max_len=40)
    parity, why = hf_parity(tiny_hf_folder, model, batch)
    assert why == "" and parity.output == "last_hidden_state"
    assert parity.reference.startswith("transformers ") and parity.reference.endswith("BertModel")
    assert parity.output_diff < 1e-4 and parity.hidden_diff < 1e-4 and parity.attention_diff < 1e-5
    assert parity.n_tokens == int(batch.attention_mask.sum())
    assert "parity with transformers" in parity.describe()


def test_no_report_for_a_qkv_folder(tiny_model):
    model, tok = load(tiny_model)
    parity, why = hf_parity(tiny_model, model, encode_texts(tok, TEXTS, max_len=32))
    assert parity is None and why == "not a Hugging Face folder"


def test_minilm_parity(minilm):
    pytest.importorskip("transformers")
    model, tok = load(minilm)
    parity, why = hf_parity(minilm, model, encode_texts(tok, TEXTS, max_len=128))
    assert why == "", why
    assert parity.output_diff < 1e-4 and parity.attention_diff < 1e-5
