"""Reading fine-tuning data: every format, and every bad input refused with one clear line."""

from __future__ import annotations

import gzip
import json

import pytest

from qkv.finetune.examples import FinetuneDataError, label_set, read_conll, read_examples, split_examples, subsample


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_jsonl_csv_tsv_and_gz_give_the_same_examples(tmp_path):
    rows = [("good film, great cast", "pos"), ('bad, "awful" plot', "neg"), ("fine\tenough", "pos")]
    j = _write(tmp_path / "a.jsonl", "".join(json.dumps({"text": t, "label": lab, "id": i}) + "\n"
                                             for i, (t, lab) in enumerate(rows)) + "\n")
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["label", "text"])
    w.writerows([(lab, t) for t, lab in rows])
    c = _write(tmp_path / "a.csv", buf.getvalue())
    buf = io.StringIO()
    csv.writer(buf, delimiter="\t").writerows([("text", "label"), *rows])
    t = _write(tmp_path / "a.tsv", buf.getvalue())
    g = tmp_path / "a.jsonl.gz"
    g.write_bytes(gzip.compress(j.read_bytes()))
    got = [read_examples(p, "sequence-classification") for p in (j, c, t, g)]
    for ex in got:
        assert ex.inputs == [r[0] for r in rows] and ex.targets == [r[1] for r in rows]
    assert got[1].sources[0].endswith("a.csv:2")


def test_named_dataset_and_integer_labels(tmp_path):
    ex = read_examples("dataset:reuters8:test", "sequence-classification")
    assert len(ex) == 2189 and set(ex.targets) >= {"earn", "acq"}
    j = _write(tmp_path / "i.jsonl", '{"text": "a", "label": 2}\n{"text": "b", "label": 10}\n{"text": "c", "label": 2}\n')
    ints = read_examples(j, "sequence-classification")
    labels, kind = label_set(ints, ints, "sequence-classification")
    assert labels == ("2", "10") and kind == "int"  # integers in numeric order


def test_regression_targets_and_conll(tmp_path):
    j = _write(tmp_path / "r.csv", "text,label\nx,1.5\ny,-2\n")
    assert read_examples(j, "regression").targets == [1.5, -2.0]
    c = _write(tmp_path / "t.conll", "-DOCSTART- -X- O\n\nJohn NNP B-PER\nruns VBZ O\n\nParis NNP B-LOC\n")
    ex = read_examples(c, "token-classification")
    assert ex.inputs == [["John", "runs"], ["Paris"]] and ex.targets == [["B-PER", "O"], ["B-LOC"]]
    words_only = read_conll(_write(tmp_path / "w.txt", "John\nruns\n\nParis\n"), with_tags=False)
    assert words_only.inputs == [["John", "runs"], ["Paris"]]
    tj = _write(tmp_path / "t.jsonl", '{"tokens": ["a", "b"], "tags": ["O", "B-X"]}\n')
    assert read_examples(tj, "token-classification").targets == [["O", "B-X"]]


@pytest.mark.parametrize("content,task,needle", [
    ('{"text": "a"}\n', "sequence-classification", "no field/column 'label'"),
    ('{"text": "a", "label": null}\n', "sequence-classification", "missing or empty"),
    ('{"text": "a", "label": ""}\n', "sequence-classification", "missing or empty"),
    ('{"text": "a", "label": 1}\n{"text": "b", "label": "1"}\n', "sequence-classification", "mixed types"),
    ('{"text": "a", "label": true}\n', "sequence-classification", "must be a string or an integer"),
    ('{"text": "a", "label": "high"}\n', "regression", "is not a number"),
    ('{"text": 3, "label": "x"}\n', "sequence-classification", "must be a string"),
    ('{"tokens": ["a", "b"], "tags": ["O"]}\n', "token-classification", "2 words but 1 tags"),
    ('{"tokens": ["a"]}\n', "token-classification", "no field/column 'tags'"),
    ("", "sequence-classification", "no examples"),
    ("{not json\n", "sequence-classification", "not valid JSON"),
])
def test_bad_input_is_one_clear_error(tmp_path, content, task, needle):
    path = _write(tmp_path / "bad.jsonl", content)
    with pytest.raises(FinetuneDataError, match=needle) as e:
        read_examples(path, task)
    assert "\n" not in str(e.value) and "bad.jsonl" in str(e.value)


def test_csv_without_the_label_column_names_the_columns_found(tmp_path):
    path = _write(tmp_path / "x.csv", "text,category\nhello,a\n")
    with pytest.raises(FinetuneDataError, match=r"no field/column 'label' \(found: 'text', 'category'\).*--label-field"):
        read_examples(path, "sequence-classification")
    path = _write(tmp_path / "y.csv", "text,label\nhello,a,extra\n")
    with pytest.raises(FinetuneDataError, match="3 fields, but the header has 2"):
        read_examples(path, "sequence-classification")


def test_unknown_format_unlabelled_dataset_and_missing_file(tmp_path):
    with pytest.raises(FinetuneDataError, match="unknown format"):
        read_examples(_write(tmp_path / "a.txt", "x\n"), "sequence-classification")
    with pytest.raises(FinetuneDataError, match="has no labels"):
        read_examples("dataset:pydoc", "sequence-classification")
    with pytest.raises(FinetuneDataError, match="no such file"):
        read_examples(tmp_path / "nope.jsonl", "sequence-classification")


def test_label_set_refuses_an_unknown_held_out_label_and_too_few_labels(tmp_path):
    train = read_examples(_write(tmp_path / "tr.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n'),
                          "sequence-classification")
    held = read_examples(_write(tmp_path / "ev.jsonl", '{"text": "c", "label": "z"}\n'), "sequence-classification")
    with pytest.raises(FinetuneDataError, match=r"held-out label 'z' \(at .*ev.jsonl:1\) is not among the 2 labels"):
        label_set(train, held, "sequence-classification")
    one = read_examples(_write(tmp_path / "one.jsonl", '{"text": "a", "label": "x"}\n'), "sequence-classification")
    with pytest.raises(FinetuneDataError, match="at least 2"):
        label_set(one, one, "sequence-classification")
    with pytest.raises(FinetuneDataError, match="--reset-head"):
        label_set(train, train, "sequence-classification", head=("x", "w"))
    assert label_set(train, train, "sequence-classification", given=("y", "x"))[0] == ("y", "x")


def test_split_and_subsample_are_seeded_and_disjoint(tmp_path):
    ex = read_examples("dataset:reuters8:test", "sequence-classification")
    a, b = split_examples(ex, 0.2, seed=3)
    assert len(a) + len(b) == len(ex) and not set(a.sources) & set(b.sources)
    assert split_examples(ex, 0.2, seed=3)[1].sources == b.sources
    s = subsample(ex, 100, 0, "train")
    assert len(s) == 100 and "subsample of 100 of 2189" in s.notes[-1]


def test_plain_text_is_not_read_as_conll(tmp_path):
    """Twenty lines of prose are refused for token classification (and its prediction), never read as
    one 'sentence' of each line's first word."""
    from qkv.finetune.examples import FinetuneDataError, read_conll, read_examples

    prose = tmp_path / "notes.txt"
    prose.write_text("".join(f"line {i} of ordinary prose with several words\n" if i % 2 else f"short line {i}\n"
                             for i in range(20)))
    with pytest.raises(FinetuneDataError, match=r"notes.txt, line 2: 8 columns where line 1 has 3: not a CoNLL file"):
        read_examples(prose, "token-classification")
    with pytest.raises(FinetuneDataError, match="not a CoNLL file"):
        read_conll(prose, with_tags=False)
    conll = tmp_path / "ok.conll"
    conll.write_text("Alice B-PER\nsaw O\n\nParis B-LOC\n")
    assert read_examples(conll, "token-classification").inputs == [["Alice", "saw"], ["Paris"]]


def test_a_too_small_label_set_names_where_it_came_from():
    from qkv.finetune.examples import Examples, FinetuneDataError, label_set

    train = Examples()
    for i, lab in enumerate(["a", "b", "a"]):
        train.add(f"text {i}", lab, f"f:{i}")
    with pytest.raises(FinetuneDataError, match=r"--labels gives 1 label \(a\); classification needs at least 2"):
        label_set(train, Examples(), "sequence-classification", given=["a"])
    one = Examples()
    one.add("text", "a", "f:1")
    with pytest.raises(FinetuneDataError, match=r"the training data has 1 label \(a\)"):
        label_set(one, Examples(), "sequence-classification")
