"""``inspect``: one text's attention, the PNG heatmaps, and the offline viewer driven in headless
Chromium (Debian ``chromium`` + ``chromium-driver``, Python ``selenium``)."""

from __future__ import annotations

import importlib.util
import io
import json
import shutil

import numpy as np
import pytest
from analysis_support import MAX_LEN, N_HEADS, N_LAYERS, pydoc_texts

from qkv.analysis.inputs import AnalysisInputError
from qkv.analysis.viewer import inspect_text, write_inspection
from qkv.analysis.viewer_html import quantize_attention

MIN_WEIGHT = 0.02  # the viewer's default line threshold


def dequantize_attention(q: np.ndarray) -> np.ndarray:
    """What the viewer's JavaScript computes from :func:`quantize_attention`'s output."""
    return q.astype(np.float64) / 65535


@pytest.fixture(scope="module")
def inspection(tiny_hf_model, tiny_tokenizer):
    return inspect_text(tiny_hf_model, tiny_tokenizer, "the cat sat on the mat because it was tired",
                        "then it slept")


def test_inspect_returns_every_attention_map(inspection, tiny_tokenizer):
    ins = inspection
    t = len(ins.tokens)
    assert ins.tokens[0] == "[CLS]" and ins.tokens.count("[SEP]") == 2
    assert ins.attentions.shape == (N_LAYERS, N_HEADS, t, t)
    assert ins.hidden_states.shape == (N_LAYERS + 1, t, 24)
    np.testing.assert_allclose(ins.attentions.sum(-1), 1.0, atol=1e-5)
    assert ins.token_type_ids.tolist() == [0] * (ins.tokens.index("[SEP]") + 1) + [1] * (
        t - ins.tokens.index("[SEP]") - 1)
    assert ins.special == [tok in ("[CLS]", "[SEP]") for tok in ins.tokens]


def test_inspect_long_text_is_an_error_unless_truncated(tiny_hf_model, tiny_tokenizer):
    long = pydoc_texts(1)[0]
    with pytest.raises(AnalysisInputError, match=f"more than the model's window of {MAX_LEN}"):
        inspect_text(tiny_hf_model, tiny_tokenizer, long)
    ins = inspect_text(tiny_hf_model, tiny_tokenizer, long, long_text="truncate")
    assert len(ins.tokens) == MAX_LEN and ins.tokens[-1] == "[SEP]"
    with pytest.raises(AnalysisInputError, match="empty"):
        inspect_text(tiny_hf_model, tiny_tokenizer, "   ")


def test_inspect_takes_what_qkv_load_returns(tiny_hf_folder, inspection, tmp_path):
    import qkv
    from qkv.analysis.viewer import run_inspect

    text, pair = "the cat sat on the mat because it was tired", "then it slept"
    ours = inspect_text(*qkv.load(tiny_hf_folder), text, pair)
    assert ours.tokens == inspection.tokens
    np.testing.assert_allclose(ours.attentions, inspection.attentions, atol=1e-5)
    ins, paths = run_inspect(qkv.load(tiny_hf_folder), text, tmp_path / "i", text_b=pair)
    assert ins.tokens == inspection.tokens and paths["viewer"].is_file()
    with pytest.raises(AnalysisInputError, match=r"the model has no tokenizer.*pass its tokenizer"):
        inspect_text(qkv.load(tiny_hf_folder).model, None, text)


def test_viewer_weights_survive_quantisation(inspection):
    back = dequantize_attention(quantize_attention(inspection.attentions))
    np.testing.assert_allclose(back, inspection.attentions, atol=1e-5)


def test_written_files_are_offline(inspection, tmp_path):
    paths = write_inspection(inspection, tmp_path, title="tiny")
    for layer in range(N_LAYERS):  # layers numbered from 0
        assert paths[f"layer_{layer}"].read_bytes()[:4] == b"\x89PNG"
    assert paths["overview"].read_bytes()[:4] == b"\x89PNG"
    page = paths["viewer"].read_text()
    for remote in ('src="http', 'href="http', "<link", "<script src", "@import", "url("):
        assert remote not in page


def _chromium():
    """(chromium binary, chromedriver) or a skip reason."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        return None, "headless Chromium absent: apt-get install -y chromium chromium-driver"
    if importlib.util.find_spec("selenium") is None:
        return None, "selenium is not installed: pip install selenium"
    return (browser, driver), None


def open_chromium(tmp_path):
    """A headless Chromium driver (skips the test when it is absent)."""
    found, reason = _chromium()
    if found is None:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = found[0]
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=found[1]), options=opts)


def wait_ready(drv, timeout: float = 60.0) -> None:
    """Until the viewer has inflated its maps and drawn (``body[data-ready]``)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(drv, timeout).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")


def test_viewer_in_headless_chromium(inspection, tmp_path):
    drv = open_chromium(tmp_path)
    from PIL import Image
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    page = write_inspection(inspection, tmp_path / "ins")["viewer"]
    try:
        drv.get(page.as_uri())
        wait_ready(drv)
        attn = dequantize_attention(quantize_attention(inspection.attentions))  # the numbers in the page
        layer, head, q = 1, 2, 3
        Select(drv.find_element(By.ID, "layer")).select_by_value(str(layer))
        Select(drv.find_element(By.ID, "head")).select_by_value(str(head))
        # no hover: every line of the head above the threshold
        n_all = len(drv.find_elements(By.CSS_SELECTOR, "#lines line.attn"))
        assert n_all == int((attn[layer, head] >= MIN_WEIGHT).sum())

        left = drv.find_element(By.CSS_SELECTOR, f'g.tok[data-side="left"][data-i="{q}"]')
        ActionChains(drv).move_to_element(left).perform()
        lines = drv.find_elements(By.CSS_SELECTOR, "#lines line.attn")
        want = {j for j in range(attn.shape[-1]) if attn[layer, head, q, j] >= MIN_WEIGHT}
        assert {int(x.get_attribute("data-to")) for x in lines} == want and len(lines) == len(want)
        assert {x.get_attribute("data-from") for x in lines} == {str(q)}
        assert {x.get_attribute("data-head") for x in lines} == {str(head)}
        for x in lines:
            j = int(x.get_attribute("data-to"))
            assert float(x.get_attribute("data-weight")) == pytest.approx(attn[layer, head, q, j], abs=1e-4)
        lit = drv.find_elements(By.CSS_SELECTOR, 'g.tok.highlight[data-side="right"]')
        assert {int(g.get_attribute("data-i")) for g in lit} == want
        assert "active" in left.get_attribute("class")
        assert inspection.tokens[q] in drv.find_element(By.ID, "info").text

        # what attends to the key token k, over all heads in colours
        Select(drv.find_element(By.ID, "head")).select_by_value("all")
        k = 0
        right = drv.find_element(By.CSS_SELECTOR, f'g.tok[data-side="right"][data-i="{k}"]')
        ActionChains(drv).move_to_element(right).perform()
        lines = drv.find_elements(By.CSS_SELECTOR, "#lines line.attn")
        assert {x.get_attribute("data-to") for x in lines} == {str(k)}
        assert len(lines) == int((attn[layer, :, :, k] >= MIN_WEIGHT).sum())
        assert len({x.get_attribute("stroke") for x in lines}) > 1  # one colour per head
        assert len(drv.find_elements(By.CSS_SELECTOR, "#legend span")) == N_HEADS

        # model view: one thumbnail per layer x head; a click selects it
        thumbs = drv.find_elements(By.CSS_SELECTOR, "#modelview canvas.thumb")
        assert len(thumbs) == N_LAYERS * N_HEADS
        drv.execute_script("arguments[0].scrollIntoView()", thumbs[-1])
        thumbs[-1].click()
        assert Select(drv.find_element(By.ID, "layer")).first_selected_option.get_attribute("value") == str(N_LAYERS - 1)
        assert Select(drv.find_element(By.ID, "head")).first_selected_option.get_attribute("value") == str(N_HEADS - 1)
        assert "selected" in thumbs[-1].get_attribute("class")
        assert drv.execute_script("return window.qkvViewer.state.layer") == N_LAYERS - 1

        drv.execute_script("window.scrollTo(0, 0)")
        shot = Image.open(io.BytesIO(drv.get_screenshot_as_png())).convert("RGB")
        colours = shot.getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 20  # not blank
        assert max(c for c, _ in colours) < 0.98 * shot.width * shot.height
        assert not [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
    finally:
        drv.quit()


def test_inspect_a_causal_lm_shows_causal_maps(tiny_tokenizer):
    """A causal LM: its causal stack's maps, every weight on a later key (above the diagonal) zero."""
    import torch

    from qkv.config import ModelConfig
    from qkv.models.builders import build_causal_lm

    torch.manual_seed(0)
    model = build_causal_lm(ModelConfig.preset("tiny", vocab_size=1000, norm="pre", max_len=64)).eval()
    ins = inspect_text(model, tiny_tokenizer, "the cat sat on the mat")
    t = len(ins.tokens)
    above = np.triu(np.ones((t, t), dtype=bool), k=1)
    assert ins.attentions.shape[-2:] == (t, t) and np.all(ins.attentions[..., above] == 0)
    np.testing.assert_allclose(ins.attentions.sum(-1), 1.0, atol=1e-5)


def test_viewer_at_512_tokens_with_every_method_and_export(tiny_tokenizer, tmp_path):
    """A 512-token text: the page opens, draws lines for the hovered token only, switches method, and
    exports every view as SVG (parsed here) and PNG."""
    import base64
    import xml.etree.ElementTree as ET

    import torch

    from qkv.config import ModelConfig
    from qkv.models.builders import build_encoder

    drv = open_chromium(tmp_path)
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    torch.manual_seed(0)
    enc = build_encoder(ModelConfig.preset("tiny", dropout=0.0, vocab_size=400, max_len=512,
                                           initializer_range=0.3)).eval()
    ins = inspect_text(enc, tiny_tokenizer, " ".join(pydoc_texts(40)), long_text="truncate",
                       methods=("value_norm", "rollout", "flow"), ablation=True)
    n_layers, n_heads, t, _ = ins.attentions.shape
    assert t == 512 and "flow" not in ins.maps and any("flow" in n for n in ins.notes)
    page = write_inspection(ins, tmp_path / "long")["viewer"]
    try:
        drv.get(page.as_uri())
        wait_ready(drv)
        options = [o.get_attribute("value") for o in Select(drv.find_element(By.ID, "method")).options]
        assert options == ["raw", "value_norm", "rollout"]
        assert "flow" in drv.find_element(By.ID, "notes").text
        assert drv.execute_script("return document.getElementById('matrix').width") == t
        assert not drv.find_elements(By.CSS_SELECTOR, "#lines line.attn")  # long: nothing until a token is hovered
        attn = dequantize_attention(quantize_attention(ins.attentions))
        q = 5
        token = drv.find_element(By.CSS_SELECTOR, f'g.tok[data-side="left"][data-i="{q}"]')
        drv.execute_script("arguments[0].scrollIntoView()", token)
        ActionChains(drv).move_to_element(token).perform()
        lines = drv.find_elements(By.CSS_SELECTOR, "#lines line.attn")
        assert {x.get_attribute("data-from") for x in lines} == {str(q)}
        assert len(lines) == int((attn[0, 0, q] >= MIN_WEIGHT).sum())
        assert len(drv.find_elements(By.CSS_SELECTOR, "#ablation div.abl")) == n_layers * n_heads
        assert not drv.find_element(By.ID, "importance-section").is_displayed()  # not a classifier

        Select(drv.find_element(By.ID, "method")).select_by_value("rollout")
        WebDriverWait(drv, 30).until(lambda d: d.execute_script("return window.qkvViewer.state.method") == "rollout")
        assert not drv.find_element(By.ID, "head").is_enabled()
        thumbs = drv.find_elements(By.CSS_SELECTOR, "#modelview canvas.thumb")
        assert [c.get_attribute("data-head") for c in thumbs] == ["all"] * n_layers
        got = drv.execute_script("return window.qkvViewer.weight(1, 0, 7, 3)")
        assert got == pytest.approx(ins.maps["rollout"][1, 7, 3], abs=2e-5)

        for view in ("head", "matrix", "model", "ablation"):
            root = ET.fromstring(drv.execute_script(f"return window.qkvViewer.exportSVG('{view}')"))
            assert root.tag.endswith("svg")
        model_svg = ET.fromstring(drv.execute_script("return window.qkvViewer.exportSVG('model')"))
        titles = [e.text for e in model_svg.iter() if e.tag.endswith("title")]
        assert titles == [f"L0…L{i} combined" for i in range(n_layers)]
        png = drv.execute_async_script(
            "const done = arguments[0]; window.qkvViewer.exportPNG('matrix').then(done, e => done('error ' + e))")
        assert png.startswith("data:image/png;base64,")
        assert base64.b64decode(png.split(",", 1)[1])[:4] == b"\x89PNG"
        assert not [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
    finally:
        drv.quit()


# ---------------------------------------------------------------- a translation's page
SOURCES = ["in the beginning God created the heaven", "and the earth was without form", "and God said"]


@pytest.fixture(scope="module")
def translation(tmp_path_factory):
    """A random 2 + 2-layer, 3-head encoder–decoder with a subword vocabulary, one sentence inspected
    (distinct sizes: 2 layers, 3 heads, S ≠ T)."""
    import torch

    from qkv.analysis.seq2seq_inspect import inspect_seq2seq
    from qkv.config import ModelConfig
    from qkv.models.builders import build_encoder_decoder
    from qkv.translation.subwords import BOS, EOS, PAD, train_subwords

    tok = train_subwords(SOURCES + ["en el principio creó Dios los cielos"], vocab_size=70)
    cfg = ModelConfig.from_flat(vocab_size=tok.get_vocab_size(), type_vocab_size=0, pad_token_id=PAD,
                                decoder=dict(start_token_id=BOS, eos_token_id=EOS), d_model=48, n_heads=3, d_ff=64,
                                n_layers=2, max_len=48, position="sinusoidal", norm="pre", dropout=0.0)
    torch.manual_seed(0)
    model = build_encoder_decoder(cfg).eval()
    return inspect_seq2seq(model, tok, SOURCES[0], max_new_tokens=6)


def _page_data(page: str) -> dict:
    import json
    from html.parser import HTMLParser

    class Collect(HTMLParser):
        def __init__(self):
            super().__init__()
            self.open, self.data, self.inside = [], None, False

        def handle_starttag(self, tag, attrs):
            if tag not in ("meta", "input", "br", "img", "option"):
                self.open.append(tag)
            self.inside = dict(attrs).get("id") == "qkv-data"

        def handle_endtag(self, tag):
            if tag != "option":
                assert self.open.pop() == tag, tag

        def handle_data(self, data):
            if self.inside:
                self.data, self.inside = data, False

    p = Collect()
    p.feed(page)
    p.close()
    assert p.open == []  # every element closed
    return json.loads(p.data)


def test_a_translation_page_shows_cross_decoder_and_encoder_attention(translation, tmp_path):
    from qkv.analysis.seq2seq_inspect import write_seq2seq_inspection

    ins = translation
    paths = write_seq2seq_inspection(ins, tmp_path / "ins")
    page = paths["viewer"].read_text(encoding="utf-8")
    data = _page_data(page)
    L, H, T, S = ins.cross_attentions.shape
    assert (L, H) == (2, 3) and S == len(ins.source_tokens) and T == len(ins.target_tokens)
    assert data["order"] == ["cross", "decoder", "encoder"] and (data["n_layers"], data["n_heads"]) == (L, H)
    cross = data["methods"]["cross"]
    assert len(cross["layers"]) == L and cross["per_head"]
    assert cross["keys"]["tokens"] == ins.source_tokens
    rows = [f"{a}→{b}" for a, b in zip(ins.target_tokens, ins.output_tokens)]
    assert cross["queries"]["tokens"] == rows and data["tokens"] == ins.target_tokens
    assert data["methods"]["encoder"]["queries"]["tokens"] == ins.source_tokens
    assert "keys" not in data["methods"]["decoder"]  # the page's tokens: the target
    assert cross["keys"]["special"][-1] and not cross["keys"]["special"][0]  # [EOS] is grey
    for t in ins.source_tokens:
        assert json.dumps(t)[1:-1] in page
    for remote in ('src="http', 'href="http', "<link", "<script src"):
        assert remote not in page


def test_a_translation_page_in_headless_chromium(translation, tmp_path):
    from qkv.analysis.seq2seq_inspect import write_seq2seq_inspection

    drv = open_chromium(tmp_path)
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    ins = translation
    page = write_seq2seq_inspection(ins, tmp_path / "ins")["viewer"]
    L, H, T, S = ins.cross_attentions.shape
    try:
        drv.get(page.as_uri())
        wait_ready(drv)
        names = lambda sel: [o.get_attribute("value") for o in Select(drv.find_element(By.ID, sel)).options]  # noqa: E731
        assert names("method") == ["cross", "decoder", "encoder"]
        assert names("layer") == [str(l) for l in range(L)] and names("head") == [*map(str, range(H)), "all"]
        layer, head, q = L - 1, H - 1, T - 1
        Select(drv.find_element(By.ID, "layer")).select_by_value(str(layer))
        Select(drv.find_element(By.ID, "head")).select_by_value(str(head))
        cross = dequantize_attention(quantize_attention(ins.cross_attentions))
        left = drv.find_elements(By.CSS_SELECTOR, 'g.tok[data-side="left"]')
        right = drv.find_elements(By.CSS_SELECTOR, 'g.tok[data-side="right"]')
        assert [g.text for g in right] == ins.source_tokens and len(left) == T
        assert len(drv.find_elements(By.CSS_SELECTOR, "#lines line.attn")) == int((cross[layer, head] >= MIN_WEIGHT).sum())
        ActionChains(drv).move_to_element(left[q]).perform()
        lines = drv.find_elements(By.CSS_SELECTOR, "#lines line.attn")
        want = {j for j in range(S) if cross[layer, head, q, j] >= MIN_WEIGHT}
        assert {int(x.get_attribute("data-to")) for x in lines} == want
        assert drv.execute_script("const m = document.getElementById(\"matrix\"); return [m.width, m.height]") == [S, T]
        assert len(drv.find_elements(By.CSS_SELECTOR, "#modelview canvas.thumb")) == L * H
        # the encoder's view: the source on both sides
        Select(drv.find_element(By.ID, "method")).select_by_value("encoder")
        WebDriverWait(drv, 30).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, 'g.tok[data-side="left"]')) == S)
        right = drv.find_elements(By.CSS_SELECTOR, 'g.tok[data-side="right"]')
        left = drv.find_elements(By.CSS_SELECTOR, 'g.tok[data-side="left"]')
        assert len(left) == len(right) == S
        assert drv.execute_script("const m = document.getElementById(\"matrix\"); return [m.width, m.height]") == [S, S]
        assert not [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
    finally:
        drv.quit()
