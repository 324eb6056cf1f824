"""qkv.finetune.metrics against independent references: sklearn, scipy, hand-worked conlleval cases
(and seqeval where it happens to be installed)."""

import json
import os
import struct
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from sklearn import metrics as skm

from qkv.finetune import metrics as M

# ---------------------------------------------------------------- classification


def _check_against_sklearn(y_true, y_pred, n_labels):
    labels = [f"c{i}" for i in range(n_labels)]
    rep = M.classification_report(y_true, y_pred, labels)
    ids = list(range(n_labels))
    assert rep["n"] == len(y_true)
    assert rep["accuracy"] == pytest.approx(skm.accuracy_score(y_true, y_pred), abs=1e-12)
    for avg in ("macro", "weighted"):
        ref = skm.f1_score(y_true, y_pred, labels=ids, average=avg, zero_division=0)
        assert rep[f"{avg}_f1"] == pytest.approx(ref, abs=1e-12), avg
    p, r, f, s = skm.precision_recall_fscore_support(y_true, y_pred, labels=ids, average=None,
                                                     zero_division=0)
    assert [c["label"] for c in rep["per_class"]] == labels
    for k, c in enumerate(rep["per_class"]):
        assert (c["precision"], c["recall"], c["f1"]) == pytest.approx((p[k], r[k], f[k]), abs=1e-12)
        assert c["support"] == s[k]
    assert rep["confusion"] == skm.confusion_matrix(y_true, y_pred, labels=ids).tolist()
    json.dumps(rep)
    return rep


def test_classification_with_a_class_never_predicted_and_one_absent():
    rng = np.random.default_rng(0)
    y_true = rng.choice([0, 1, 2, 4], size=200)  # class 3 never occurs in y_true
    y_pred = rng.choice([0, 1, 3, 4], size=200)  # class 2 never predicted, 3 only falsely
    rep = _check_against_sklearn(y_true.tolist(), y_pred.tolist(), 6)  # class 5: neither
    assert rep["per_class"][2]["precision"] == 0.0 and rep["per_class"][2]["support"] > 0
    assert rep["per_class"][3]["support"] == 0 and rep["per_class"][3]["f1"] == 0.0
    assert rep["per_class"][5] == {"label": "c5", "precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    # macro-F1 is the mean over all six classes, absent ones included
    assert rep["macro_f1"] == pytest.approx(sum(c["f1"] for c in rep["per_class"]) / 6)


@pytest.mark.filterwarnings("ignore:A single label was found")  # sklearn's, for one-class samples
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7).flatmap(lambda L: st.tuples(
    st.just(L), st.lists(st.tuples(st.integers(0, L - 1), st.integers(0, L - 1)), min_size=1, max_size=50))))
def test_classification_matches_sklearn(case):
    n_labels, pairs = case
    y_true, y_pred = map(list, zip(*pairs))
    _check_against_sklearn(y_true, y_pred, n_labels)


def test_classification_perfect_and_numpy_input():
    y = np.array([0, 1, 2, 1], dtype=np.int32)
    rep = M.classification_report(y, y, ["a", "b", "c"])
    assert rep["accuracy"] == rep["macro_f1"] == rep["weighted_f1"] == 1.0
    assert rep["confusion"] == [[1, 0, 0], [0, 2, 0], [0, 0, 1]]
    assert type(rep["accuracy"]) is float and type(rep["confusion"][0][0]) is int


@pytest.mark.parametrize("y_true, y_pred, labels, match", [
    ([0, 1], [0], ["a", "b"], "y_true has 2 items but y_pred has 1"),
    ([0, 2], [0, 1], ["a", "b"], r"y_true\[1\] = 2 is out of range for 2 labels"),
    ([0, 1], [0, -1], ["a", "b"], r"y_pred\[1\] = -1 is out of range"),
    ([0, 1], [0.0, 1.5], ["a", "b"], "y_pred must hold integer class ids"),
    ([], [], ["a"], "empty"),
    ([0], [0], [], "labels is empty"),
])
def test_classification_validation(y_true, y_pred, labels, match):
    with pytest.raises(ValueError, match=match):
        M.classification_report(y_true, y_pred, labels)


# ---------------------------------------------------------------- regression


def test_regression_against_scipy_with_ties():
    rng = np.random.default_rng(1)
    t = rng.integers(0, 6, size=80).astype(float)  # many ties on both sides
    p = np.round(t + rng.normal(0, 1.5, size=80))
    rep = M.regression_report(t.tolist(), p.tolist())
    assert rep["n"] == 80
    assert rep["rmse"] == pytest.approx(np.sqrt(np.mean((p - t) ** 2)), abs=1e-12)
    assert rep["mae"] == pytest.approx(np.mean(np.abs(p - t)), abs=1e-12)
    assert rep["pearson"] == pytest.approx(stats.pearsonr(t, p)[0], abs=1e-12)
    assert rep["spearman"] == pytest.approx(stats.spearmanr(t, p)[0], abs=1e-12)
    json.dumps(rep)


def test_regression_by_hand():
    rep = M.regression_report([1, 2, 3], [1, 2, 5])  # errors 0, 0, 2
    assert rep["rmse"] == pytest.approx(np.sqrt(4 / 3)) and rep["mae"] == pytest.approx(2 / 3)
    assert M.regression_report([1, 2, 3], [3, 2, 1])["spearman"] == pytest.approx(-1.0)
    assert M.regression_report([1, 2, 2, 3], [1, 5, 5, 9])["spearman"] == pytest.approx(1.0)


def test_regression_constant_side_gives_none_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rep = M.regression_report([1.0, 2.0, 3.0], [2.0, 2.0, 2.0])
        one = M.regression_report([4.0], [5.0])
    assert rep["pearson"] is None and rep["spearman"] is None and rep["mae"] == pytest.approx(2 / 3)
    assert one["pearson"] is None and one["rmse"] == 1.0
    assert "-" in M.format_regression(rep)


@pytest.mark.parametrize("t, p, match", [
    ([1, 2], [1], "y_true has 2 items but y_pred has 1"),
    ([], [], "empty"),
    ([1, float("nan")], [1, 2], r"y_true\[1\] = nan is not finite"),
    ([1, 2], ["a", 2], "y_pred must hold numbers"),
])
def test_regression_validation(t, p, match):
    with pytest.raises(ValueError, match=match):
        M.regression_report(t, p)


# ---------------------------------------------------------------- entity spans


@pytest.mark.parametrize("tags, expected", [
    (["B-PER", "I-PER", "O", "B-LOC"], {("PER", 0, 2), ("LOC", 3, 4)}),  # entity at sentence end
    (["O", "I-PER", "I-PER", "O"], {("PER", 1, 3)}),  # I- after O starts an entity (lenient)
    (["B-PER", "I-LOC", "I-LOC"], {("PER", 0, 1), ("LOC", 1, 3)}),  # type change mid-entity
    (["B-PER", "B-PER", "I-PER"], {("PER", 0, 1), ("PER", 1, 3)}),
    (["B-PER", "O", "I-PER"], {("PER", 0, 1), ("PER", 2, 3)}),
    (["B-MISC-X", "I-MISC-X"], {("MISC-X", 0, 2)}),  # the type is everything after the first "-"
    (["O", "O"], set()),
    ([], set()),
])
def test_spans_iob2(tags, expected):
    assert M.spans(tags, "IOB2") == expected
    assert M.spans(tags) == expected and M.spans(tags, "auto") == expected


def test_spans_iob1():
    # IOB1: I- starts an entity, B- only separates adjacent entities of one type
    assert M.spans(["I-PER", "I-PER", "B-PER", "O", "I-LOC"], "IOB1") == {
        ("PER", 0, 2), ("PER", 2, 3), ("LOC", 4, 5)}
    assert M.spans(["I-PER", "I-LOC", "I-LOC"], "IOB1") == {("PER", 0, 1), ("LOC", 1, 3)}


@pytest.mark.parametrize("tags, expected", [
    (["S-PER", "B-LOC", "I-LOC", "E-LOC", "O", "B-ORG", "E-ORG"],
     {("PER", 0, 1), ("LOC", 1, 4), ("ORG", 5, 7)}),
    (["S-PER", "S-PER"], {("PER", 0, 1), ("PER", 1, 2)}),
    (["B-PER", "E-PER", "E-PER"], {("PER", 0, 2), ("PER", 2, 3)}),  # E after E starts anew
    (["O", "B-LOC", "I-LOC"], {("LOC", 1, 3)}),  # unterminated at the end: closed there
    (["O", "E-PER"], {("PER", 1, 2)}),
    (["S-PER", "I-PER", "E-PER"], {("PER", 0, 1), ("PER", 1, 3)}),
    (["B-PER", "E-LOC"], {("PER", 0, 1), ("LOC", 1, 2)}),
])
def test_spans_bioes(tags, expected):
    assert M.spans(tags, "BIOES") == expected
    assert M.spans(tags, "IOBES") == expected
    assert M.spans(tags, "auto") == expected


def test_spans_unprefixed_tags_are_io():
    assert M.spans(["PER", "PER", "O", "LOC", "LOC", "PER"]) == {("PER", 0, 2), ("LOC", 3, 5), ("PER", 5, 6)}
    assert M.spans(["PER", "LOC"], "IOB1") == {("PER", 0, 1), ("LOC", 1, 2)}


@pytest.mark.parametrize("tags, scheme, match", [
    (["B-PER", "S-PER"], "IOB2", r"token 1: tag 'S-PER' is not allowed in this scheme, which takes B-TYPE"),
    (["E-PER"], "IOB1", "'E-PER' is not allowed"),
    (["B-"], "auto", "'B-' has a prefix but no entity type"),
    (["O", ""], "IOB2", "token 1: tag '' is not a non-empty string"),
    (["O"], "BILOU", "scheme='BILOU': expected one of"),
])
def test_spans_validation(tags, scheme, match):
    with pytest.raises(ValueError, match=match):
        M.spans(tags, scheme)


def _random_tags(rng, n, prefixes):
    return [[("O" if (pr := rng.choice(prefixes)) == "O" else f"{pr}-{rng.choice(['PER', 'LOC'])}")
             for _ in range(rng.integers(0, 12))] for _ in range(n)]


@pytest.mark.parametrize("prefixes", [["B", "I", "O", "O"], ["B", "I", "E", "S", "O"]])
def test_spans_and_token_report_match_seqeval(prefixes):
    ss = pytest.importorskip("seqeval.metrics.sequence_labeling")
    sm = pytest.importorskip("seqeval.metrics")
    rng = np.random.default_rng(2)
    true, pred = _random_tags(rng, 300, prefixes), _random_tags(rng, 300, prefixes)
    pred = [p[:len(t)] + ["O"] * (len(t) - len(p)) for t, p in zip(true, pred)]
    for sent in true + pred:
        assert M.spans(sent, "auto") == {(ty, s, e + 1) for ty, s, e in ss.get_entities(sent)}
    rep = M.token_report(true, pred)
    assert rep["entity_precision"] == pytest.approx(sm.precision_score(true, pred))
    assert rep["entity_recall"] == pytest.approx(sm.recall_score(true, pred))
    assert rep["entity_f1"] == pytest.approx(sm.f1_score(true, pred))
    assert rep["token_accuracy"] == pytest.approx(sm.accuracy_score(true, pred))


# ---------------------------------------------------------------- token report

TRUE = [["B-PER", "I-PER", "O", "B-LOC"],   # PER(0,2) LOC(3,4)
        ["B-ORG", "I-ORG", "I-ORG", "O"],   # ORG(0,3)
        ["O", "B-PER", "O"],                # PER(1,2)
        ["O", "O"]]                         # -
PRED = [["B-PER", "I-PER", "O", "B-ORG"],   # PER(0,2) hit, ORG(3,4) wrong type
        ["B-ORG", "I-ORG", "O", "O"],       # ORG(0,2) wrong boundary
        ["O", "B-PER", "O"],                # PER(1,2) hit
        ["B-LOC", "O"]]                     # LOC(0,1) spurious
# 4 true entities, 5 predicted, 2 exact hits: P = 2/5, R = 2/4, F1 = 2PR/(P+R) = 0.4/0.9 = 4/9.
# Tokens: 13, wrong at s0[3], s1[2], s3[0] -> 10/13. Per type: LOC 0 hit / 1 pred / 1 true,
# ORG 0 / 2 / 1, PER 2 / 2 / 2.


def test_token_report_by_hand():
    rep = M.token_report(TRUE, PRED)
    assert rep["token_accuracy"] == pytest.approx(10 / 13)
    assert rep["entity_precision"] == pytest.approx(0.4)
    assert rep["entity_recall"] == pytest.approx(0.5)
    assert rep["entity_f1"] == pytest.approx(4 / 9)
    assert (rep["n_tokens"], rep["n_sentences"], rep["n_true_entities"], rep["n_pred_entities"]) == (13, 4, 4, 5)
    assert rep["scheme"] == "IOB2"
    assert rep["per_type"] == [
        {"type": "LOC", "precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1},
        {"type": "ORG", "precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1},
        {"type": "PER", "precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 2}]
    json.dumps(rep)
    text = M.format_token(rep)
    assert "F1 0.4444" in text and "(4 true, 5 predicted)" in text
    assert text.splitlines()[-1].split() == ["PER", "1.0000", "1.0000", "1.0000", "2"]


def test_token_report_perfect_and_empty():
    rep = M.token_report(TRUE, TRUE)
    assert rep["token_accuracy"] == rep["entity_precision"] == rep["entity_recall"] == rep["entity_f1"] == 1.0
    assert all(t["f1"] == 1.0 for t in rep["per_type"])
    none = M.token_report([["O", "O"]], [["O", "O"]])  # no entities anywhere: 0/0 counts as 0
    assert none["token_accuracy"] == 1.0 and none["entity_f1"] == 0.0 and none["per_type"] == []
    bioes = M.token_report([["S-PER", "O"]], [["B-PER", "E-PER"]])
    assert bioes["scheme"] == "BIOES" and bioes["entity_f1"] == 0.0


@pytest.mark.parametrize("true, pred, kw, match", [
    ([["O"], ["O"]], [["O"]], {}, "true_tags has 2 sentences but pred_tags has 1"),
    ([["O"], ["O", "O"]], [["O"], ["O"]], {}, "sentence 1: 2 true tags but 1 predicted tags"),
    ([[]], [[]], {}, "no tokens"),
    ([["O"], ["S-PER"]], [["O"], ["O"]], {"scheme": "IOB2"}, "true_tags sentence 1, token 0: tag 'S-PER'"),
])
def test_token_report_validation(true, pred, kw, match):
    with pytest.raises(ValueError, match=match):
        M.token_report(true, pred, **kw)


# ---------------------------------------------------------------- plot and text


def _png_size(path):
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("n", [3, 52])
def test_plot_confusion_writes_png_atomically(tmp_path, n):
    rng = np.random.default_rng(n)
    labels = [f"class_{i}_" + "x" * (i % 30) for i in range(n)]
    y = rng.integers(0, n, size=20 * n)
    conf = M.classification_report(y, np.where(rng.random(y.size) < 0.7, y, rng.integers(0, n, y.size)),
                                   labels)["confusion"]
    out = M.plot_confusion(conf, labels, tmp_path / "sub" / "confusion.png", title="test")
    assert out == tmp_path / "sub" / "confusion.png"
    w, h = _png_size(out)
    assert os.listdir(out.parent) == ["confusion.png"]
    if n == 52:
        assert w > 1500 and h > 1500  # grows with the class count


def test_plot_confusion_failure_keeps_old_file(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    path = tmp_path / "c.png"
    path.write_bytes(b"old")

    def boom(*a, **k):
        raise RuntimeError("render failed")

    monkeypatch.setattr(Figure, "savefig", boom)
    with pytest.raises(RuntimeError):
        M.plot_confusion([[1, 0], [0, 1]], ["a", "b"], path)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["c.png"]


def test_plot_confusion_validation(tmp_path):
    with pytest.raises(ValueError, match=r"confusion has shape \(2, 2\) but there are 3 labels"):
        M.plot_confusion([[1, 0], [0, 1]], ["a", "b", "c"], tmp_path / "c.png")
    assert not list(tmp_path.iterdir())


def test_format_classification_with_baselines():
    rep = M.classification_report([0, 1, 1, 2], [0, 1, 0, 2], ["neg", "neu", "pos"])
    majority = M.classification_report([0, 1, 1, 2], [1, 1, 1, 1], ["neg", "neu", "pos"])
    text = M.format_classification(rep, baselines={"majority": majority, "chance": {"accuracy": 0.333}})
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["accuracy", "macro-F1", "weighted-F1"]
    assert lines[2].split()[:2] == ["model", "0.7500"]
    assert lines[3].split()[:2] == ["majority", "0.5000"]
    assert lines[4].split() == ["chance", "0.3330", "-", "-", "-"]
    assert any(line.split()[:1] == ["neu"] and line.split()[-1] == "2" for line in lines)


def test_format_regression_with_baseline():
    rep = M.regression_report([1, 2, 3], [1, 2, 5])
    mean = M.regression_report([1, 2, 3], [2, 2, 2])
    lines = M.format_regression(rep, baselines={"mean": mean}).splitlines()
    assert lines[0].split() == ["RMSE", "MAE", "Pearson", "Spearman", "n"]
    assert lines[3].split() == ["mean", "0.8165", "0.6667", "-", "-", "3"]


def test_paired_comparison_counts_discordant_examples_and_matches_scipy():
    from scipy.stats import binomtest

    from qkv.finetune.baselines import paired

    y = [0, 1, 2, 0, 1, 2, 0, 1]
    model = [0, 1, 2, 0, 1, 0, 1, 1]      # wrong at 5, 6
    baseline = [0, 0, 0, 0, 1, 2, 0, 1]   # wrong at 1, 2
    pr = paired(y, model, baseline)
    assert pr["model_only"] == 2 and pr["baseline_only"] == 2 and pr["p_value"] == binomtest(2, 4, 0.5).pvalue
    assert paired(y, y, y) == {"model_only": 0, "baseline_only": 0, "p_value": 1.0}
