"""The attention explorer at ``/``: its files load nothing from elsewhere, and in headless Chromium
(Debian ``chromium`` + ``chromium-driver``, Python ``selenium``; skipped without them) it renders a
sentence's attention, shows the masked-word predictions and the index's nearest documents, puts
text from requests in as text, and streams a causal LM's generation."""

from __future__ import annotations

import http.client
import importlib.util
import re
import shutil
import urllib.parse

import numpy as np
import pytest
from serve_support import running

import qkv
from qkv.serve.config import ServeConfig, parse_model_spec
from qkv.serve.pages import ASSETS

HOSTILE = '<img src=x id=pwned onerror="document.title=1">'


@pytest.fixture(scope="module")
def server(tiny_folders):
    specs = tuple(parse_model_spec(f"{n}={tiny_folders[n]}") for n in ("mlm", "lm"))
    srv = running(ServeConfig(models=specs, port=0, index=str(tiny_folders["index"])))
    yield srv
    srv.stop()


def _get(url: str, path: str):
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", path)
    r = conn.getresponse()
    out = r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
    conn.close()
    return out


def test_the_explorer_files_are_served_from_the_package_and_load_nothing_else(server):
    for path, name in (("/", "index.html"), ("/explorer/explorer.js", "explorer.js"),
                       ("/explorer/explorer.css", "explorer.css")):
        status, headers, text = _get(server.url, path)
        assert status == 200 and headers["content-type"] == ASSETS[name]
        assert "script-src 'self'" in headers["content-security-policy"] and headers["x-frame-options"] == "DENY"
        assert not re.search(r"(https?:)?//[a-z0-9]", text.replace("http://www.w3.org", "")), name  # no CDN
        assert "@import" not in text and "url(" not in text
    assert _get(server.url, "/explorer/index.html")[0] == 404
    assert _get(server.url, "/explorer/missing.js")[0] == 404


def _chromium():
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        return None, "headless Chromium absent: apt-get install -y chromium chromium-driver"
    if importlib.util.find_spec("selenium") is None:
        return None, "selenium is not installed: pip install selenium"
    return (browser, driver), None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    found, reason = _chromium()
    if found is None:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = found[0]
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                f"--user-data-dir={tmp_path_factory.mktemp('profile')}", "--window-size=1400,1800"):
        opts.add_argument(arg)
    drv = webdriver.Chrome(service=Service(executable_path=found[1]), options=opts)
    yield drv
    drv.quit()


def _wait(drv, script: str, timeout: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(drv, timeout).until(lambda d: d.execute_script(script))


def test_the_explorer_renders_attention_predictions_and_neighbours(server, browser, tiny_folders):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from qkv.analysis.viewer import inspect_text
    from qkv.analysis.fill_mask import fill_mask
    from qkv.data.tokenizer import WordPieceTokenizer
    from qkv.embeddings.search import SearchIndex

    drv = browser
    drv.get(server.url + "/")
    _wait(drv, "return document.body.dataset.ready === '1'")
    text = f"the class [MASK] a function {HOSTILE}"
    box = drv.find_element(By.ID, "text")
    box.clear()
    box.send_keys(text)
    drv.find_element(By.ID, "run").click()
    _wait(drv, "return document.body.dataset.runs === '1'")
    assert drv.find_element(By.ID, "error").get_attribute("hidden") is not None, drv.find_element(By.ID, "error").text

    model, tok = qkv.load(tiny_folders["mlm"])
    ins = inspect_text(model, tok, text)
    spans = drv.find_elements(By.CSS_SELECTOR, "#tokens span.tok")
    assert [s.text for s in spans] == ins.tokens  # "<", "img" … shown as text
    assert drv.find_elements(By.ID, "pwned") == [] and drv.title == "qkv attention explorer"
    L, H, T = ins.attentions.shape[:3]
    assert len(drv.find_elements(By.CSS_SELECTOR, "#thumbs canvas.thumb")) == L * H
    shown = drv.execute_script(
        "const x = window.qkvExplorer, s = x.state, out = [];"
        "for (let l = 0; l < s.nLayers; l++) for (let h = 0; h < s.nHeads; h++) for (let i = 0; i < s.tokens.length; i++)"
        " for (let j = 0; j < s.tokens.length; j++) out.push(x.weight(l, h, i, j)); return out;")
    np.testing.assert_allclose(np.array(shown).reshape(ins.attentions.shape), ins.attentions, atol=1e-5)

    layer, head, q = L - 1, H - 1, 2
    Select(drv.find_element(By.ID, "layer")).select_by_value(str(layer))
    Select(drv.find_element(By.ID, "head")).select_by_value(str(head))
    heatmap = drv.find_element(By.ID, "heatmap")
    assert (heatmap.get_attribute("data-layer"), heatmap.get_attribute("data-head")) == (str(layer), str(head))
    cell, left, top = (int(heatmap.get_attribute(f"data-{k}")) for k in ("cell", "left", "top"))
    for i, j in ((q, 0), (q, T - 1), (0, 1)):  # the map's pixels are the weights
        r, g, b, _ = drv.execute_script(
            "return Array.from(arguments[0].getContext('2d').getImageData(arguments[1], arguments[2], 1, 1).data)",
            heatmap, left + j * cell + cell // 2, top + i * cell + cell // 2)
        w = ins.attentions[layer, head, i, j]
        assert abs(r - (255 - w * 206)) <= 1.01 and abs(b - (255 - w * 49)) <= 1.01, (i, j, w, r, g, b)
    ActionChains(drv).move_to_element(spans[q]).perform()
    assert "active" in spans[q].get_attribute("class")
    assert f"{ins.tokens[q]} attends to" in drv.find_element(By.ID, "info").text

    predictions = drv.find_elements(By.CSS_SELECTOR, "#predictions li")
    [want] = fill_mask(model, WordPieceTokenizer(tok), [text], k=10)
    assert [p.get_attribute("data-token") for p in predictions] == [t for t, _ in want.top]
    np.testing.assert_allclose([float(p.get_attribute("data-probability")) for p in predictions],
                               [p for _, p in want.top], rtol=1e-6)

    hits = drv.find_elements(By.CSS_SELECTOR, "#hits li")
    query = text.replace("[MASK]", " ").strip()
    best = SearchIndex(tiny_folders["index"]).query(query, k=5)[0]
    assert [h.get_attribute("data-rank") for h in hits] == [str(h.rank) for h in best]
    assert hits[0].find_element(By.CSS_SELECTOR, ".doc").text.split()[:3] == best[0].text.split()[:3]
    assert not [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]


def test_the_explorer_streams_a_causal_lms_generation(server, browser, tiny_folders):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from qkv.generation.prompts import generate_texts

    drv = browser
    drv.get(server.url + "/")
    _wait(drv, "return document.body.dataset.ready === '1'")
    Select(drv.find_element(By.ID, "model")).select_by_value("lm")
    assert drv.find_element(By.ID, "generate-panel").get_attribute("hidden") is None
    box = drv.find_element(By.ID, "text")
    box.clear()
    box.send_keys("the class")
    n = drv.find_element(By.ID, "max-tokens")
    n.clear()
    n.send_keys("7")
    drv.find_element(By.ID, "generate").click()
    _wait(drv, "return document.getElementById('generation').dataset.done === '1'")
    want = generate_texts(*qkv.load(tiny_folders["lm"]), ["the class"], max_new_tokens=7)[0]
    assert drv.find_element(By.ID, "generation").get_attribute("textContent") == "the class" + want
    assert drv.find_element(By.ID, "error").get_attribute("hidden") is not None
