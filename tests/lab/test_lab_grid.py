"""Lab grids: the built-in ones load and build every cell; the file format's checks name the problem;
cells, learning-rate sweeps, overrides and subsets."""

from __future__ import annotations

import json

import pytest

from qkv.lab.grid import LabGrid, builtin_lab_grids, is_lab_grid, load_lab_grid, parse_metric

BUILTIN = ("lab-projections", "lab-scaling", "lab-heads", "lab-positions", "lab-norm", "lab-similarity")


def small(**over):
    data = {"name": "t", "question": "q?", "task": "copy_offset", "base": {"steps": 5},
            "variants": {"a": {}, "b": {"model": {"n_heads": 2}}}}
    data.update(over)
    return data


def test_the_builtin_lab_grids_are_the_six_questions_and_build():
    assert tuple(builtin_lab_grids()) == tuple(sorted(BUILTIN))
    for name in BUILTIN:
        grid = load_lab_grid(name)
        assert grid.name == name and grid.claim and len(grid.variants) >= 2 and is_lab_grid(name)
        assert grid.cells()  # every cell built an EncoderTaskConfig while loading
    assert not is_lab_grid("projections")  # the text grid of the same question


def test_cells_merge_model_keys_and_expand_learning_rate_sweeps():
    grid = LabGrid.from_dict(small(base={"steps": 5, "model": {"d_model": 32, "n_heads": 4}},
                                   variants={"a": {"lr": [0.001, 0.01]}, "b": {"model": {"n_heads": 2}}}))
    cells = grid.cells()
    assert [c.name for c in cells] == ["a@lr=0.001", "a@lr=0.01", "b"]
    assert cells[0].variant == "a" and cells[0].overrides["lr"] == 0.001
    assert cells[2].overrides["model"] == {"d_model": 32, "n_heads": 2}
    over = grid.cells({"steps": 9, "model": {"dropout": 0.1}})
    assert all(c.overrides["steps"] == 9 and c.overrides["model"]["dropout"] == 0.1 for c in over)
    assert [c.name for c in grid.cells({"lr": 0.5})] == ["a", "b"]  # --lr replaces the sweep


def test_subset_keeps_comparisons_and_maps_among_the_kept_variants():
    grid = LabGrid.from_dict(small(variants={"a": {}, "b": {}, "c": {}}, comparisons=[["a", "b"], ["a", "c"]],
                                   maps=["a", "c"]))
    sub = grid.subset(["a", "b"])
    assert list(sub.variants) == ["a", "b"] and sub.comparisons == (("a", "b"),) and sub.maps is None
    with pytest.raises(ValueError, match="--variants: 'z'"):
        grid.subset(["z"])


@pytest.mark.parametrize("over,message", [
    ({"task": "copyy"}, "task='copyy'; allowed: mqar"),
    ({"colour": 1}, r"unknown key\(s\) \['colour'\]"),
    ({"variants": {}}, "variants must be a non-empty object"),
    ({"variants": {"a b": {}}}, "variant name 'a b'"),
    ({"variants": {"a": {"seed": 3}}}, "'seed' belongs to the grid"),
    ({"variants": {"a": {"task_options": {}}}}, "'task_options' belongs to the grid"),
    ({"variants": {"a": {"stepz": 3}}}, "unknown key 'stepz'; allowed: task_options, model, steps"),
    ({"variants": {"a": {"model": {"n_headz": 2}}}}, "cell 'a'"),
    ({"variants": {"a": {"lr": []}}}, "lr sweep"),
    ({"metric": "loss"}, "metric='loss' must be accuracy"),
    ({"metric": "accuracy@64"}, "needs 64 in eval_lengths"),
    ({"comparisons": [["a", "z"]]}, "comparisons: no variant 'z'"),
    ({"comparisons": [["a", "a"]]}, "must be two different variant names"),
    ({"maps": ["a"]}, "maps"),
    ({"task_options": {"shiftt": 2}}, "unknown option"),
])
def test_bad_grids_are_refused_naming_the_problem(over, message):
    with pytest.raises(ValueError, match=message):
        LabGrid.from_dict(small(**over), source="g.json")


def test_metric_names_and_loading_a_file(tmp_path):
    assert parse_metric("accuracy") == ("accuracy", None)
    assert parse_metric("sequence_accuracy@128") == ("sequence_accuracy", 128)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(small(base={"steps": 5, "eval_lengths": [64]}, metric="accuracy@64")))
    assert is_lab_grid(str(path)) and load_lab_grid(path).metric == "accuracy@64"
    (tmp_path / "bad.json").write_text("{")
    assert not is_lab_grid(str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="unknown lab grid 'nope'; built-in: lab-heads"):
        load_lab_grid("nope")
