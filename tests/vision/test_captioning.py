"""Image captioning on the training engine: a test-sized run learns a tiny canvas set (held-out canvases
with held-out combinations captioned exactly, the written names looking at their items' cells), saves a
model that loads with its tokenizer, resumes as finished; the scores checked against hand-made cases."""

import json

import numpy as np
import pytest
import torch
from caption_support import tiny_canvases, train_tiny

from qkv.checkpoints.io import load
from qkv.config_image import ImageConfig
from qkv.data.canvases import CaptionSet
from qkv.data.caption_grammar import FASHION_NAMES
from qkv.data.errors import ImageDataError
from qkv.data.images import pixel_values
from qkv.models.vision import ImageCaptioner
from qkv.vision.caption import Captions, caption_with_attention
from qkv.vision.caption_config import CaptionTrainConfig, caption_model_config
from qkv.vision.caption_scores import attention_in_cell, baselines, cell_masks, exact_match, text_scores
from qkv.vision.captioning import train_captions


def test_the_captioning_model_learns_a_tiny_canvas_set(tiny_run):
    r = tiny_run.report
    assert tiny_run.status == "complete" and tiny_run.steps_done == 300
    assert r["eval_canvases"] == 60
    assert r["model"]["exact_match"] >= 0.9, r["examples"]  # every held-out canvas has an unseen combination
    assert r["model"]["exact_match"] > r["baselines"]["most_frequent_caption"]["exact_match"]
    assert r["model"]["bleu"] > r["baselines"]["names_without_relations"]["bleu"]
    cell = r["attention_in_cell"]
    assert cell["all_names"]["all_layers_heads_mean"] > cell["chance"] + 0.3, cell
    assert len(cell["all_names"]["per_layer_head"]) == 2 and len(cell["all_names"]["per_layer_head"][0]) == 2


def test_the_run_folder_holds_the_model_its_tokenizer_and_the_report(tiny_run):
    out = tiny_run.out
    saved = json.loads((out / "report.json").read_text())
    assert saved["model"] == tiny_run.report["model"] and saved["bleu_signature"].startswith("nrefs:1|")
    md = (out / "report.md").read_text()
    assert "most frequent training caption" in md and "Attention in the named item's cell" in md
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows if "exact_match" in x] == [150, 300]
    model, tokenizer = load(out)
    assert isinstance(model, ImageCaptioner) and tokenizer is not None
    _, held = tiny_canvases()
    written = caption_with_attention(model, tokenizer, pixel_values(held.pixels[:5]))
    assert written.captions == [e["caption"] for e in tiny_run.report["examples"][:5]]
    L, H, T = 2, 2, 5  # caption-tiny: 2 layers, 2 heads; [CLS] + 2×2 patches
    assert written.cross_attentions.shape[:3] == (5, L, H) and written.cross_attentions.shape[-1] == T
    torch.testing.assert_close(written.cross_attentions.sum(-1), torch.ones(written.cross_attentions.shape[:-1]))
    assert written.prefix == 1 and written.grid == (2, 2)


def test_a_finished_run_resumes_as_finished(tiny_run):
    cfg = CaptionTrainConfig(out=str(tiny_run.out), preset="caption-tiny", progress=False, eval_sample=60,
                             eval_every=150)
    again = train_captions(cfg, data=tiny_canvases(), resume=True)
    assert again.status == "complete" and again.report == json.loads((tiny_run.out / "report.json").read_text())


def test_cell_masks_by_hand():
    image = ImageConfig(size=(12, 12), patch=3, cls_token=True)  # 4×4 patches, cells of 6: 2×2 patches each
    masks = cell_masks(image, 6)
    assert masks.shape == (2, 2, 17) and not masks[..., 0].any()
    grid = masks[..., 1:].reshape(2, 2, 4, 4)
    want = np.zeros((4, 4), bool)
    want[2:, :2] = True  # the cell in row 1, column 0
    assert np.array_equal(grid[1, 0], want) and masks.sum() == 16


def _data(items, names=FASHION_NAMES):
    return CaptionSet(np.zeros((len(items), 1, 12, 12), np.uint8), tuple("x" for _ in items), np.array(items),
                      tuple(names), (2, 2), 6, frozenset(), "hand")


def test_attention_in_cell_by_hand():
    image = ImageConfig(size=(12, 12), patch=6, cls_token=True)  # one patch per cell: tokens [CLS], 4 patches
    items = [[[7, 0, 0], [8, 1, 1], [-1, -1, -1]]]  # a sneaker top left, a bag bottom right
    words = [["a", "sneaker", "above", "and", "left", "of", "a", "dress"]]  # the second name is wrong
    att = torch.zeros(1, 1, 2, 8, 5)  # (B,L,H,n,T)
    att[0, 0, 0, 1, 1] = 1.0  # head 1 at "sneaker": the top-left patch (hit)
    att[0, 0, 1, 1, 0] = 1.0  # head 2 at "sneaker": [CLS] (miss)
    att[0, 0, 0, 7, 4] = 1.0  # head 1 at "dress" (the bag's place): bottom-right patch (hit)
    att[0, 0, 1, 7, 2] = 0.6  # head 2 at "dress": top-right (miss)
    att[0, 0, 1, 7, 4] = 0.4
    written = Captions([" ".join(words[0])], words, torch.zeros(1, 9, dtype=torch.long), att, 1, (2, 2))
    r = attention_in_cell(written, _data(items), image)
    assert r["names_counted"] == 2 and r["chance"] == 0.2
    assert r["all_names"]["per_layer_head"] == [[1.0, 0.0]]
    assert r["correct_names"]["names"] == 1 and r["correct_names"]["per_layer_head"] == [[1.0, 0.0]]
    # heads' mean at "sneaker": 0.5 on the top-left patch, 0.5 on [CLS] → argmax the first, [CLS]; at "dress": 0.7 vs 0.3
    assert r["all_names"]["per_layer_heads_mean"] == [0.5]
    assert r["all_names"]["best"] == {"layer": 1, "head": 1, "rate": 1.0}


def test_text_scores_and_baselines_by_hand():
    assert exact_match(["a top", "a bag  left of a top"], ["a top", "a bag left of a top"]) == 1.0
    assert text_scores(["a top"], ["a bag"])["exact_match"] == 0.0
    with pytest.raises(ValueError, match="one per reference"):
        exact_match(["a"], [])
    train = _data([[[0, 0, 0], [1, 0, 1]]] * 3)
    train = CaptionSet(train.pixels, ("a top left of a trouser", "a top left of a trouser", "a bag above a top"),
                       np.zeros((3, 2, 3), np.int64), FASHION_NAMES, (2, 2), 6, frozenset(), "hand")
    test = CaptionSet(train.pixels[:2], ("a top left of a trouser", "a bag above a coat"), np.zeros((2, 2, 3), np.int64),
                      FASHION_NAMES, (2, 2), 6, frozenset(), "hand")
    b = baselines(train, test)
    assert b["most_frequent_caption"]["caption"] == "a top left of a trouser"
    assert b["most_frequent_caption"]["exact_match"] == 0.5 and b["names_without_relations"]["exact_match"] == 0.0


def test_model_settings_follow_the_data_and_the_grammar():
    cfg = caption_model_config("caption-tiny", 20, (16, 16), 1, {"n_layers": 1})
    assert cfg.vocab_size == 20 and cfg.image.size == (16, 16) and cfg.n_layers == 1
    with pytest.raises(ValueError, match="vocab_size: it follows"):
        caption_model_config("caption-tiny", 20, (16, 16), 1, {"vocab_size": 50})
    with pytest.raises(ValueError, match="image.size.*follows the data"):
        caption_model_config("caption-tiny", 20, (16, 16), 1, {"image": {"size": [32, 32]}})
    with pytest.raises(ValueError, match="unknown caption recipe"):
        CaptionTrainConfig(out="x", preset="vit-digits")


def test_an_interrupted_run_resumes_bit_for_bit(tmp_path):
    def crash_at_15(step, model):
        if step == 15:
            raise RuntimeError("the machine went away")

    whole = train_tiny(tmp_path / "whole", steps=24, save_every=10, eval_every=24)
    with pytest.raises(RuntimeError, match="went away"):
        cfg = CaptionTrainConfig(out=str(tmp_path / "cut"), preset="caption-tiny", progress=False, eval_sample=60,
                                 steps=24, save_every=10, eval_every=24)
        train_captions(cfg, data=tiny_canvases(), on_backward=crash_at_15)
    before = (tmp_path / "cut" / "run.json").read_text()
    train, held = tiny_canvases()
    with pytest.raises(ImageDataError) as e:  # other data: refused in one line, the run left as it was
        train_captions(cfg, data=(held, train), resume=True)
    assert str(e.value) == (f"--resume: the canvases differ from those {tmp_path / 'cut'} was started with; "
                            "resume with the same data, or start a new run")
    assert (tmp_path / "cut" / "run.json").read_text() == before
    resumed = train_captions(cfg, data=(train, held), resume=True)
    assert resumed.status == "complete" and resumed.steps_done == 24
    a, b = load(whole.out).model.state_dict(), load(resumed.out).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.report["model"] == whole.report["model"]


def test_a_bf16_run_trains_and_scores(tmp_path):
    result = train_tiny(tmp_path / "bf16", steps=6, precision="bf16")
    assert result.status == "complete" and result.report["precision"] in ("bf16", "fp32")
    assert 0 <= result.report["model"]["bleu"] <= 100
