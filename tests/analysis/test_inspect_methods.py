"""``qkv inspect``'s views beside raw attention: value norms, rollout, flow and head ablation on one text;
SVG exports that name every head; the numbering convention."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

from qkv.analysis.attribution import attention_flow, attention_rollout, value_norms
from qkv.analysis.hooked import Batch, layer_paths
from qkv.analysis.inputs import AnalysisInputError
from qkv.analysis.inspect_methods import ablation_scan, method_maps
from qkv.analysis.interventions import ablated
from qkv.analysis.naming import head_label, hidden_label, layer_label, parse_head
from qkv.analysis.viewer import inspect_text, write_inspection
from qkv.config import ModelConfig
from qkv.models.builders import build_encoder
from interp_support import classifier

TEXT = "the cat sat on the mat because it was tired"


@pytest.fixture(scope="module")
def encoder():
    """A random qkv encoder (3 heads, width 24, 2 layers) over the tiny tokenizer's 400 ids."""
    torch.manual_seed(0)
    return build_encoder(ModelConfig.preset("tiny", dropout=0.0, vocab_size=400, max_len=64,
                                            initializer_range=0.3)).eval()


@pytest.fixture(scope="module")
def inspection(encoder, tiny_tokenizer):
    return inspect_text(encoder, tiny_tokenizer, TEXT, methods=("value_norm", "rollout", "flow"), ablation=True)


def test_naming_is_from_zero_and_parses_back():
    assert (layer_label(0), head_label(2, 5), hidden_label(0), hidden_label(1)) == ("L0", "L2H5", "emb", "L0")
    assert parse_head("l2h5") == (2, 5) and parse_head(head_label(11, 0)) == (11, 0)
    for bad in ("2.5", "L2", "LxH1", "H1L2"):
        with pytest.raises(ValueError, match="write L<layer>H<head>"):
            parse_head(bad)


def test_rollout_and_flow_views_equal_the_attribution_functions(inspection):
    weights = torch.from_numpy(inspection.attentions)[:, None]  # (L,1,H,T,T)
    np.testing.assert_allclose(inspection.maps["rollout"], attention_rollout(weights, all_layers=True)[:, 0].numpy())
    flow = attention_flow(weights, all_layers=True, normalize=True)[:, 0].numpy()
    np.testing.assert_allclose(inspection.maps["flow"], flow)
    for m in ("rollout", "flow"):
        assert inspection.maps[m].shape == inspection.attentions.shape[:1] + inspection.attentions.shape[2:]
        np.testing.assert_allclose(inspection.maps[m].sum(-1), 1.0, atol=1e-9)


def test_value_norm_view_is_each_rows_share_of_the_norms(encoder, inspection):
    per_layer = value_norms(encoder, inspection.batch())
    vn = inspection.maps["value_norm"]
    assert vn.shape == inspection.attentions.shape
    for layer, norms in enumerate(per_layer):
        rows = norms.per_head[0].numpy()  # (H,T,T)
        np.testing.assert_allclose(vn[layer], rows / rows.sum(-1, keepdims=True), rtol=1e-6)
    assert not np.allclose(vn, inspection.attentions, atol=1e-3)  # it is not the raw attention again


def test_flow_is_left_out_above_its_limit_with_a_note(encoder, inspection):
    t = len(inspection.tokens)
    maps, notes = method_maps(encoder, inspection.attentions, inspection.batch(), ("raw", "flow"), flow_max_tokens=t - 1)
    assert "flow" not in maps and len(notes) == 1
    assert f"--flow-max-tokens {t}" in notes[0]
    with pytest.raises(AnalysisInputError, match="unknown method 'rolout'"):
        inspect_text(encoder, None, TEXT, methods=("rolout",))


def test_ablation_scan_equals_switching_each_head_off_by_hand(encoder, inspection):
    effects, metric = inspection.ablation, inspection.ablation_metric
    assert effects.shape == (len(layer_paths(encoder)), 3) and "relative change" in metric
    batch = inspection.batch()
    base = encoder(batch.input_ids, batch.attention_mask).last_hidden_state
    layer, head = 1, 2
    ids = batch.input_ids
    with torch.no_grad():
        with ablated(encoder, [(layer, head)]):
            h = encoder(ids, batch.attention_mask).last_hidden_state
        want = ((h - base).norm(dim=-1) / base.norm(dim=-1)).mean().item()
    assert effects[layer, head] == pytest.approx(want, rel=1e-5)
    assert (effects > 0).all()


def test_ablation_scan_of_a_classifier_measures_the_predicted_class():
    model = classifier()
    ids = torch.tensor([[2, 11, 40, 7, 3]])
    batch = Batch(ids, torch.ones_like(ids, dtype=torch.bool))
    effects, metric = ablation_scan(model, batch)
    assert "probability of the predicted class" in metric
    with torch.no_grad():
        p = model(ids, torch.ones_like(ids, dtype=torch.bool)).logits.softmax(-1)[0]
        k = int(p.argmax())
        with ablated(model, [(0, 1)]):
            q = model(ids, torch.ones_like(ids, dtype=torch.bool)).logits.softmax(-1)[0]
    assert effects[0, 1] == pytest.approx(float(q[k] - p[k]), abs=1e-6)


def _gids(path) -> set[str]:
    return {e.get("id") for e in ET.parse(path).iter() if e.get("id")}


def test_svg_exports_parse_and_name_every_head(inspection, tmp_path):
    paths = write_inspection(inspection, tmp_path, title="tiny", formats=("svg", "png"))
    n_layers, n_heads = inspection.attentions.shape[:2]
    every = {head_label(layer, h) for layer in range(n_layers) for h in range(n_heads)}
    assert every <= _gids(paths["overview"])
    for layer in range(n_layers):
        assert paths[f"layer_{layer}"].suffix == ".svg" and paths[f"layer_{layer}_png"].suffix == ".png"
        assert {head_label(layer, h) for h in range(n_heads)} <= _gids(paths[f"layer_{layer}"])
    assert every <= _gids(paths["ablation"])
    assert {f"{m}-{layer_label(i)}" for m in ("raw", "value_norm", "rollout", "flow") for i in range(n_layers)} \
        <= _gids(paths["methods"])
    text = paths["overview"].read_text()
    assert "<text" in text or "L0" in text  # text kept as text, not paths


def test_a_classifier_s_token_importance_by_every_method(tiny_tokenizer, tmp_path):
    from qkv.analysis.saliency import class_probability, integrated_gradients, leave_one_out

    model = classifier(vocab_size=400, max_len=64)
    ins = inspect_text(model, tiny_tokenizer, TEXT, methods=("rollout", "flow"), importance=True)
    imp, t = ins.importance, len(ins.tokens)
    assert list(imp) == ["blank-out", "input × gradient", "integrated gradients", "rollout ([CLS] row)",
                         "flow ([CLS] row)"] and all(v.shape == (t,) for v in imp.values())
    batch = ins.batch()
    with torch.no_grad():
        k = model(batch.input_ids, attention_mask=batch.attention_mask).logits.argmax(-1)
    target = class_probability(k)
    np.testing.assert_allclose(imp["blank-out"], leave_one_out(model, batch, target,
                                                               replacement_id=tiny_tokenizer.unk_id)[0].numpy())
    ig = integrated_gradients(model, batch, target, steps=16)
    np.testing.assert_allclose(imp["integrated gradients"], ig.scores[0].numpy(), rtol=1e-6)
    np.testing.assert_allclose(imp["rollout ([CLS] row)"], ins.maps["rollout"][-1, 0])
    assert "probability of the predicted class" in ins.importance_target
    paths = write_inspection(ins, tmp_path, formats=("svg",))
    assert set(imp) <= _gids(paths["importance"])
    assert not inspect_text(model, tiny_tokenizer, TEXT).importance  # only when asked for


def test_the_viewer_shows_a_classifier_s_token_importance(tiny_tokenizer, tmp_path):
    from test_analysis_viewer import open_chromium, wait_ready

    drv = open_chromium(tmp_path)
    from selenium.webdriver.common.by import By

    model = classifier(vocab_size=400, max_len=64)
    ins = inspect_text(model, tiny_tokenizer, TEXT, methods=("rollout",), importance=True)
    page = write_inspection(ins, tmp_path / "ins")["viewer"]
    try:
        drv.get(page.as_uri())
        wait_ready(drv)
        rows = drv.find_elements(By.CSS_SELECTOR, "#importance tr[data-i]")
        assert len(rows) == len(ins.tokens)
        for method, values in ins.importance.items():
            cells = drv.find_elements(By.CSS_SELECTOR, f'#importance td[data-method="{method}"]')
            got = [float(c.get_attribute("data-value")) for c in cells]
            np.testing.assert_allclose(got, values, rtol=1e-6, atol=1e-8)
        rows[3].click()
        assert drv.execute_script("return window.qkvViewer.state.pinned.i") == 3
        assert not [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
    finally:
        drv.quit()
