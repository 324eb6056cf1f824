"""``qkv predict`` on pictures: one JSONL line per picture (files and folders) with the label and
probabilities the model gives; --out rules as for text; bad pictures and the wrong kind of model →
one line."""

import json

import numpy as np
import pytest
import torch

from qkv.checkpoints.io import load, save
from qkv.config import ModelConfig
from qkv.models.builders import build_masked_lm
from qkv.cli import main
from qkv.data.images import pixel_values, read_image
from vision_support import LABELS, write_picture


def test_predict_writes_the_models_probabilities_per_picture(tmp_path, classifier_folder, pictures, capsys):
    out = tmp_path / "p.jsonl"
    assert main(["predict", str(classifier_folder), str(pictures[0]), str(tmp_path / "pics" / "sub"),
                 "--out", str(out)]) == 0
    assert "wrote 2 predictions" in capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [str(pictures[0]), str(pictures[2])]
    model = load(classifier_folder).model
    x = pixel_values(np.stack([read_image(pictures[0]), read_image(pictures[2])]))
    with torch.no_grad():
        want = torch.softmax(model(x).logits, -1).numpy()
    for row, p in zip(rows, want):
        assert list(row["probabilities"]) == list(LABELS)
        np.testing.assert_allclose(list(row["probabilities"].values()), p, atol=1e-6)
        assert row["label"] == LABELS[int(p.argmax())]


def test_out_rules_are_text_predicts(tmp_path, classifier_folder, pictures, capsys):
    out = tmp_path / "p.jsonl"
    out.write_text("mine")
    assert main(["predict", str(classifier_folder), str(tmp_path / "pics"), "--out", str(out)]) == 2
    assert "add --force" in capsys.readouterr().err and out.read_text() == "mine"
    assert main(["predict", str(classifier_folder), str(tmp_path / "pics"), "--out", str(out), "--force"]) == 0
    assert len(out.read_text().splitlines()) == 3


@pytest.mark.parametrize("case, fragment", [
    ("empty", "the file is empty"),
    ("garbage", "not a readable PNG or JPEG image"),
    ("size", "the picture is 9×8 pixels but the model reads 8×8"),
    ("text", "not a PNG or JPEG picture"),
    ("nothing", "holds no PNG/JPEG pictures"),
])
def test_bad_pictures_are_one_line(tmp_path, classifier_folder, case, fragment, capsys):
    spec = {"empty": tmp_path / "e.png", "garbage": tmp_path / "g.jpg", "size": tmp_path / "s.png",
            "text": tmp_path / "t.txt", "nothing": tmp_path / "none"}[case]
    if case == "empty":
        spec.write_bytes(b"")
    elif case == "garbage":
        spec.write_bytes(b"not a picture")
    elif case == "size":
        write_picture(spec, size=(8, 9))
    elif case == "text":
        spec.write_text("hello\n")
    else:
        spec.mkdir()
    assert main(["predict", str(classifier_folder), str(spec), "--out", str(tmp_path / "p.jsonl")]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "p.jsonl").exists()


def test_a_colour_picture_is_converted_with_a_note(tmp_path, classifier_folder, capsys):
    pic = write_picture(tmp_path / "c.png", colour=True)
    assert main(["predict", str(classifier_folder), str(pic), "--out", str(tmp_path / "p.jsonl")]) == 0
    assert "converted to grey" in capsys.readouterr().out


def test_a_text_model_given_a_picture_is_one_line(tmp_path, pictures, capsys):
    folder = tmp_path / "text"
    save(build_masked_lm(ModelConfig.preset("tiny", vocab_size=50, max_len=16)), folder)
    assert main(["predict", str(folder), str(pictures[0]), "--out", str(tmp_path / "p.jsonl")]) == 2
    assert "is a text model; it reads text, not pictures" in capsys.readouterr().err
