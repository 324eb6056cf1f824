"""The three reproduced findings (``qkv findings``), checked against hand computations on tiny models."""

from __future__ import annotations

import json
import string

import numpy as np
import pytest
import torch
from analysis_support import pydoc_texts
from scipy.stats import spearmanr

from qkv.analysis.attribution import attention_flow, value_norms
from qkv.analysis.findings import abnar_zuidema, kobayashi_shares, michel_pruning
from qkv.analysis.findings_run import run_findings
from qkv.analysis.hooked import Batch, encode_texts, layer_paths, run_with_cache
from qkv.analysis.inputs import AnalysisInputError
from qkv.analysis.interventions import ablated
from qkv.config import ModelConfig
from qkv.models.builders import build_encoder
from qkv.models.heads import TaskConfig
from qkv.models.task_builders import build_task_model

LABELS = ("even", "odd")


@pytest.fixture(scope="module")
def tokenizer():
    from qkv.data.tokenizer import train_tokenizer

    return train_tokenizer(pydoc_texts(60), vocab_size=300, max_chars=120_000)


@pytest.fixture(scope="module")
def classifier(tokenizer):
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=tokenizer.vocab_size, max_len=40, dropout=0.0, initializer_range=0.3)
    task = TaskConfig("sequence-classification", labels=LABELS, pooling="cls", classifier_dropout=0.0)
    return build_task_model(cfg, task).eval()


def _score(model, ids: torch.Tensor, k: int, target: str) -> float:
    with torch.no_grad():
        logits = model(ids[None], attention_mask=torch.ones(1, len(ids), dtype=torch.bool)).logits[0]
    return float(logits.softmax(-1)[k] if target == "probability" else logits[k])


@pytest.mark.parametrize("target", ["probability", "logit"])
def test_abnar_zuidema_by_hand_on_one_text(classifier, tokenizer, target):
    batch = encode_texts(tokenizer, ["the value of an object is its identity"], max_len=40)
    r = abnar_zuidema(classifier, batch, replacement_id=tokenizer.token_to_id("[UNK]"), target=target)
    ids = batch.input_ids[0]
    n = len(ids)
    k = int(classifier(batch.input_ids, attention_mask=batch.attention_mask).logits.argmax())
    base = _score(classifier, ids, k, target)
    blank = []
    for t in range(1, n - 1):  # content tokens: each replaced by [UNK]
        changed = ids.clone()
        changed[t] = tokenizer.token_to_id("[UNK]")
        blank.append(base - _score(classifier, changed, k, target))
    names = [f"{p}.attention.weights" for p in layer_paths(classifier)]
    _, kept = run_with_cache(classifier, batch, names)
    weights = [kept[x].double() for x in names]
    for layer, w in enumerate(weights):
        raw = w[0].mean(0)[0, 1:n - 1].numpy()  # [CLS]'s row, heads averaged
        assert r.mean["raw"][layer] == pytest.approx(spearmanr(raw, blank).statistic, abs=1e-6)
        assert r.top1["raw"][layer] == float(np.argmax(raw) == np.argmax(blank))
        a = torch.eye(n, dtype=torch.float64)
        for v in weights[: layer + 1]:  # rollout by hand: (0.5 A + 0.5 I), rows renormalised, multiplied
            step = 0.5 * v[0].mean(0) + 0.5 * torch.eye(n, dtype=torch.float64)
            a = (step / step.sum(-1, keepdim=True)) @ a
        assert r.mean["rollout"][layer] == pytest.approx(spearmanr(a[0, 1:n - 1], blank).statistic, abs=1e-6)
    flow = attention_flow(weights, queries=[0])[0, 0, 1:n - 1].numpy()
    assert r.mean["flow"][-1] == pytest.approx(spearmanr(flow, blank).statistic, abs=1e-6)
    assert r.n_texts == 1 and r.queries == "[CLS]" and np.all(r.std["raw"] == 0) and r.target == target
    assert r.chance == pytest.approx(1 / (n - 2))
    header, rows = r.table()
    assert header == ["layer", "raw", "rollout", "flow", "top-1 raw", "top-1 rollout", "top-1 flow"]
    assert len(rows) == len(weights) and all(len(row) == len(header) for row in rows)


def test_michel_pruning_curve_and_the_heads_within_one_point(classifier, tokenizer):
    texts = pydoc_texts(24)
    batch = encode_texts(tokenizer, texts, max_len=24, truncate=True)
    with torch.no_grad():
        labels = classifier(batch.input_ids, attention_mask=batch.attention_mask).logits.argmax(-1)
    labels[::3] = 1 - labels[::3]  # not all right: accuracy can fall and rise
    pairs = [(Batch(batch.input_ids[:12], batch.attention_mask[:12]), labels[:12])]
    evals = [(Batch(batch.input_ids[12:], batch.attention_mask[12:]), labels[12:])]
    r = michel_pruning(classifier, evals, pairs, step=2, single=True)
    L, H = r.importance.shape
    assert r.counts == list(range(0, L * H, 2)) and r.single.shape == (L, H)
    assert r.accuracy[0] == pytest.approx(float((_predict(classifier, evals[0][0]) == labels[12:]).double().mean()))
    for count, acc in zip(r.counts, r.accuracy):  # each point: the `count` least important heads off, by hand
        with ablated(classifier, r.order[:count]):
            assert acc == pytest.approx(float((_predict(classifier, evals[0][0]) == labels[12:]).double().mean()))
    ok = [c for c, a in zip(r.counts, r.accuracy) if a >= r.accuracy[0] - 0.01]
    assert r.prunable == max(ok)
    np.testing.assert_allclose(np.linalg.norm(r.importance, axis=1), 1.0)  # normalised per layer, as in the paper


def _predict(model, batch):
    with torch.no_grad():
        return model(batch.input_ids, attention_mask=batch.attention_mask).logits.argmax(-1)


def test_kobayashi_shares_by_hand(tokenizer):
    torch.manual_seed(0)
    enc = build_encoder(ModelConfig.preset("tiny", vocab_size=tokenizer.vocab_size, max_len=40, dropout=0.0,
                                           initializer_range=0.3)).eval()
    batch = encode_texts(tokenizer, ["a, b; and c.", "the end (of it)."], max_len=40)
    r = kobayashi_shares(enc, batch)
    names = [f"{p}.attention.weights" for p in layer_paths(enc)]
    _, kept = run_with_cache(enc, batch, names)
    norms = value_norms(enc, batch)
    for layer, name in enumerate(names):
        want_a, want_n, count = np.zeros(4), np.zeros(4), 0
        for b, toks in enumerate(batch.tokens):
            n = len(toks)
            cat = [0 if t == "[CLS]" else 1 if t == "[SEP]" else 2 if all(c in string.punctuation for c in t) else 3
                   for t in toks]
            for i in range(n):
                a = kept[name][b].double().mean(0)[i, :n]
                s = norms[layer].summed[b, i, :n]
                s = s / s.sum()
                for j in range(n):
                    want_a[cat[j]] += float(a[j])
                    want_n[cat[j]] += float(s[j])
                count += 1
        np.testing.assert_allclose(r.alpha[layer], want_a / count, rtol=1e-6)
        np.testing.assert_allclose(r.norm[layer], want_n / count, rtol=1e-6)
    np.testing.assert_allclose(r.alpha.sum(1), 1.0)
    assert r.token_share[2] > 0  # the texts have punctuation


def test_run_findings_writes_tables_and_figures(classifier, tokenizer, tmp_path):
    from qkv.checkpoints.io import save

    folder = tmp_path / "clf"
    save(classifier, folder, tokenizer=tokenizer.backend)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t[:200], "label": LABELS[i % 2]}) + "\n"
                            for i, t in enumerate(pydoc_texts(16))))
    for name, stems in (("abnar", ["abnar"]), ("michel", ["michel", "michel_importance"]),
                        ("kobayashi", ["kobayashi"])):
        _, paths = run_findings(name, folder, str(data), tmp_path / "out", n_texts=6, max_len=24)
        record = json.loads(paths["json"].read_text())
        assert record["finding"] and record["paper"] and record["n_texts"] == 6
        assert "| layer |" in paths["md"].read_text() or "| heads pruned |" in paths["md"].read_text()
        for stem in stems:
            assert paths[stem].read_bytes()[:4] == b"\x89PNG" and paths[f"{stem}_svg"].read_text().startswith("<?xml")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "x y z", "label": "maybe"}) + "\n" + json.dumps({"text": "a b", "label": "no"}))
    with pytest.raises(AnalysisInputError, match="are not the model's"):
        run_findings("abnar", folder, str(bad), tmp_path / "o2", n_texts=2)
    with pytest.raises(AnalysisInputError, match="unknown finding 'flow'"):
        run_findings("flow", folder, str(data), tmp_path / "o3")
