"""``declared_kind``: what a folder says it holds, read from its config file alone."""

import json

from qkv.checkpoints.io import declared_kind


def test_qkv_json_kind_then_hugging_face_model_type_then_none(tmp_path):
    assert declared_kind(tmp_path) is None  # no config file
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    assert declared_kind(tmp_path) == "vit"
    (tmp_path / "qkv.json").write_text(json.dumps({"format": "qkv", "kind": "causal_lm"}))
    assert declared_kind(tmp_path) == "causal_lm"  # qkv.json first


def test_an_unreadable_qkv_json_falls_back_and_a_non_object_says_nothing(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "marian"}))
    (tmp_path / "qkv.json").write_text("{not json")
    assert declared_kind(tmp_path) == "marian"
    (tmp_path / "qkv.json").write_text("[1, 2]")
    assert declared_kind(tmp_path) is None
    assert declared_kind(tmp_path / "missing") is None
