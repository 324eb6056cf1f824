"""``qkv inspect MODEL picture.png``: per-layer figures of the [CLS] (or a chosen patch's) attention over
the picture, rollout, a captioner's cross-attention per written word, and the viewer with the picture;
the numbers are the model's own; bad input → one line."""

import base64
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from qkv.checkpoints.io import load, save
from qkv.cli import main
from qkv.config import ModelConfig
from qkv.data.images import pixel_values, read_image
from qkv.models.builders import build_masked_lm
from qkv.models.vision_builders import build_image_captioner
from qkv.vision.attention_maps import image_attentions, rollout
from qkv.vision.config import model_config
from qkv.vision.figures import pixel_map
from qkv.vision.inspect_image import inspect_picture, write_image_inspection
from vision_support import open_chromium, write_picture


def _valid_png(path) -> bool:
    with Image.open(path) as img:
        img.verify()
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_inspect_draws_each_layer_rollout_and_a_viewer_with_the_picture(tmp_path, classifier_folder, pictures, capsys):
    out = tmp_path / "ins"
    assert main(["inspect", str(classifier_folder), str(pictures[0]), "--out", str(out), "--format", "png,svg"]) == 0
    printed = capsys.readouterr().out
    assert "17 tokens ([CLS] and patches), 2 layers × 2 heads; drawn: the attention of [CLS]" in printed
    assert "predicted " in printed
    for name in ("image_attention_layer_0", "image_attention_layer_1", "image_rollout"):
        assert _valid_png(out / f"{name}.png") and (out / f"{name}.svg").read_text().lstrip().startswith("<?xml")
    page = (out / "viewer.html").read_text()
    data = json.loads(page.split('id="qkv-data">')[1].split("</script>")[0])
    picture = Image.open(io.BytesIO(base64.b64decode(data["picture"]["png"])))
    assert np.array_equal(np.asarray(picture), read_image(pictures[0])[0])  # the picture itself, lossless
    assert data["picture"]["grid"] == [4, 4] and data["picture"]["query"] == 0
    assert 'id="picture-section"' in page and 'canvas id="picture"' in page and "qkv-render" in page
    assert data["tokens"][:3] == ["[CLS]", "r0c0", "r0c1"] and data["order"] == ["raw", "rollout"]


def test_the_inspection_holds_the_models_own_weights(classifier_folder, pictures):
    model = load(classifier_folder).model
    ins = inspect_picture(model, pictures[1], patch=(2, 3))
    want = image_attentions(model, pixel_values(read_image(pictures[1])[None]))[0]  # (L,H,T,T)
    np.testing.assert_allclose(ins.attentions, want, atol=1e-6)
    np.testing.assert_allclose(ins.rollout[-1], rollout(want), atol=1e-6)
    assert ins.query == 1 + 2 * 4 + 3 and ins.tokens[ins.query] == "r2c3"
    with torch.no_grad():
        p = torch.softmax(model(pixel_values(read_image(pictures[1])[None])).logits, -1)[0]
    assert ins.prediction["probability"] == pytest.approx(float(p.max()), abs=1e-6)


def test_pixel_map_spreads_each_patch_over_its_pixels():
    image = model_config("vit-digits", {"image": {"patch": 4, "stride": 2}}).image  # 8×8, patches of 4 every 2: 3×3
    grid = np.arange(9.0).reshape(3, 3)
    px = pixel_map(grid, image)
    assert px[0, 0] == 0 and px[0, 7] == 2 and px[7, 7] == 8
    assert px[2, 2] == pytest.approx(np.mean([0, 1, 3, 4]))  # covered by four overlapping patches


def test_a_captioners_cross_attention_is_drawn_per_written_word(tmp_path, capsys):
    torch.manual_seed(0)
    cfg = model_config("vit-digits", {"image": {"patch": 2}}, vocab_size=11, pad_token_id=0, position="learned",
                       max_len=6, d_model=24, n_heads=3, d_ff=40)
    folder = tmp_path / "captioner"
    save(build_image_captioner(cfg), folder)
    pic = write_picture(tmp_path / "p.png")
    out = tmp_path / "ins"
    assert main(["inspect", str(folder), str(pic), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "caption: " in printed
    model = load(folder).model
    ins = inspect_picture(model, pic)
    assert ins.cross_attentions.shape == (2, 3, len(ins.words), 17) and len(ins.words) == 5
    x = pixel_values(read_image(pic)[None])
    ids = model.generate(x, max_new_tokens=5)
    assert ins.words == [str(i) for i in ids[0, 1:].tolist()]
    np.testing.assert_allclose(ins.cross_attentions.sum(-1), 1.0, rtol=1e-5)
    assert _valid_png(out / "cross_attention_layer_0.png") and _valid_png(out / "cross_attention_layer_1.png")


@pytest.mark.parametrize("argv, fragment", [
    (["--patch", "4,0"], "--patch 4,0 is outside the model's 4×4 grid"),
    (["--patch", "a,b"], "give ROW,COL"),
])
def test_bad_patches_are_one_line(tmp_path, classifier_folder, pictures, argv, fragment, capsys):
    assert main(["inspect", str(classifier_folder), str(pictures[0]), "--out", str(tmp_path / "i"), *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1


def test_wrong_inputs_are_one_line(tmp_path, classifier_folder, capsys):
    text_model = tmp_path / "text"
    save(build_masked_lm(ModelConfig.preset("tiny", vocab_size=50, max_len=16)), text_model)
    big = write_picture(tmp_path / "big.png", size=(10, 8))
    cases = [([str(text_model), str(big)], "is a text model; it reads text, not pictures"),
             ([str(classifier_folder), "a cat on a mat"], "is an image model; give it one picture file"),
             ([str(classifier_folder), str(big)], "the picture is 8×10 pixels but the model reads 8×8")]
    for argv, fragment in cases:
        assert main(["inspect", *argv, "--out", str(tmp_path / "i")]) == 2
        err = capsys.readouterr().err
        assert fragment in err and len(err.strip().splitlines()) == 1, err


def test_the_viewer_draws_the_chosen_tokens_attention_over_the_picture(tmp_path, classifier_folder):
    """In headless Chromium: the [CLS] token's weights by default, the brightest overlay on its most attended
    patch; hovering a patch token, or clicking a patch on the picture, draws that patch's attention."""
    drv, reason = open_chromium(tmp_path)
    if drv is None:
        pytest.skip(reason)
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    pic = tmp_path / "grey.png"
    Image.fromarray(np.full((8, 8), 128, np.uint8)).save(pic)  # a flat picture: the overlay alone varies
    model = load(classifier_folder).model
    ins = inspect_picture(model, pic)
    paths = write_image_inspection(ins, model.config.image, tmp_path / "ins")
    try:
        drv.get(paths["viewer"].as_uri())
        WebDriverWait(drv, 60).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        canvas = drv.find_element(By.ID, "picture")
        WebDriverWait(drv, 10).until(lambda d: canvas.get_attribute("data-query") == "0")
        scale = int(canvas.get_attribute("width")) // 8
        orange = drv.execute_script(
            "const c = arguments[0].getContext('2d'), s = arguments[1], out = [];"
            "for (let r = 0; r < 4; r++) for (let k = 0; k < 4; k++) {"
            "  const p = c.getImageData((2 * k + 1) * s, (2 * r + 1) * s, 1, 1).data; out.push(p[0] - p[2]); }"
            "return out;", canvas, scale)
        weights = ins.attentions[0, 0, 0, 1:]  # layer 0, head 0, [CLS] over the 16 patches
        assert int(np.argmax(orange)) == int(np.argmax(weights)) and int(np.argmin(orange)) == int(np.argmin(weights))
        token = drv.find_element(By.CSS_SELECTOR, 'g.tok[data-side="left"][data-i="7"]')  # r1c2
        ActionChains(drv).move_to_element(token).perform()
        assert canvas.get_attribute("data-query") == "7"
        ActionChains(drv).move_to_element(canvas).perform()  # leaves the token: back to the default …
        ActionChains(drv).move_to_element_with_offset(canvas, 3 * scale, 3 * scale).click().perform()
        assert canvas.get_attribute("data-query") == str(1 + 3 * 4 + 3)  # … then the clicked patch r3c3, pinned
    finally:
        drv.quit()
