"""The lab harness end to end on a small grid (the 30-second smoke run): every run trained and written,
the report's files, resuming without retraining, refusing a folder of another configuration, two
jobs in worker processes giving the same numbers as one, and the command line."""

from __future__ import annotations

import csv
import json

import pytest

from qkv.cli import main
from qkv.lab.grid import LabGrid
from qkv.lab.runner import LabRunConfig, run_lab

GRID = {"name": "smoke", "question": "Do Q/K/V maps help?", "claim": "a claim", "task": "copy_offset",
        "task_options": {"shift": 1, "train_len": 8},
        "base": {"steps": 12, "batch_size": 16, "eval_batches": 1, "warmup_steps": 2,
                 "model": {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1}},
        "variants": {"qkv": {}, "raw": {"model": {"qkv_proj": False}, "lr": [0.001, 0.01]}},
        "comparisons": [["qkv", "raw"]], "maps": ["qkv", "raw"]}


def test_a_lab_grid_runs_reports_and_resumes(tmp_path):
    grid = LabGrid.from_dict(GRID)
    out = tmp_path / "lab"
    res = run_lab(LabRunConfig(grid, str(out), seeds=2), log=lambda m: None, progress=False)
    assert res.status == "done" and not res.errors and (res.trained, res.skipped) == (6, 0)
    for name in ("results.md", "results.csv", "accuracy.png", "attention.png"):
        assert (out / name).stat().st_size > 0
    assert sorted(p.name for p in (out / "runs" / "raw@lr=0.01").iterdir()) == ["seed0.json", "seed0.pt", "seed1.json"]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["cell"], r["seed"]) for r in rows] == [("qkv", "0"), ("qkv", "1"), ("raw@lr=0.001", "0"),
                                                      ("raw@lr=0.001", "1"), ("raw@lr=0.01", "0"), ("raw@lr=0.01", "1")]
    stored = json.loads((out / "runs" / "qkv" / "seed1.json").read_text())
    assert float(rows[1]["accuracy"]) == stored["train_eval"]["token_accuracy"]
    md = (out / "results.md").read_text()
    assert "| `qkv` − `raw` |" in md and "p (Holm)" in md and "Learning-rate sweeps" in md and "a claim" in md
    assert len(res.comparisons) == 1 and res.comparisons[0].diffs.keys() == {0, 1}
    again = run_lab(LabRunConfig(grid, str(out), seeds=2), log=lambda m: None, progress=False)
    assert (again.trained, again.skipped) == (0, 6) and again.table == res.table
    more = run_lab(LabRunConfig(grid, str(out), seeds=3, variants=("qkv",)), log=lambda m: None, progress=False)
    assert (more.trained, more.skipped) == (1, 2)
    with pytest.raises(ValueError, match=r"a run with another configuration is there \(differs in steps\)"):
        run_lab(LabRunConfig(grid, str(out), seeds=1, overrides={"steps": 13}), log=lambda m: None, progress=False)
    assert json.loads((out / "runs" / "qkv" / "seed0.json").read_text()) == \
        json.loads((out / "runs" / "qkv" / "seed0.json").read_text())  # untouched


def test_two_jobs_give_the_numbers_of_one(tmp_path):
    grid = LabGrid.from_dict({**GRID, "variants": {"qkv": {}, "raw": {"model": {"qkv_proj": False}}}})
    one = run_lab(LabRunConfig(grid, str(tmp_path / "a"), seeds=1, threads=1), log=lambda m: None, progress=False)
    two = run_lab(LabRunConfig(grid, str(tmp_path / "b"), seeds=1, jobs=2, threads=1), log=lambda m: None,
                  progress=False)
    strip = lambda t: [line.rsplit("|", 2)[0] for line in t.splitlines()]  # noqa: E731  (drop steps/s)
    assert strip(one.table) == strip(two.table)


def test_the_command_line_lists_runs_and_refuses(tmp_path, capsys):
    assert main(["ablate", "--list-grids"]) == 0
    listed = capsys.readouterr().out
    assert "Lab grids" in listed and "lab-heads [neighbours]: h1, h2, h4" in listed and "Text grids" in listed
    path = tmp_path / "g.json"
    path.write_text(json.dumps({**GRID, "variants": {"qkv": {}, "raw": {"model": {"qkv_proj": False}}}}))
    out = tmp_path / "o"
    assert main(["ablate", "--grid", str(path), "--out", str(out), "--seeds", "1", "--steps", "5", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "qkv vs raw: not decided: 1 seed — a verdict needs ≥ 2 that agree" in printed and json.loads((out / "runs" / "qkv" / "seed0.json").read_text())["steps_done"] == 5
    assert main(["ablate", "--grid", "lab-heads", "--out", str(out), "--corpus", "x.txt"]) == 2
    assert "--corpus: not for lab grid 'lab-heads'" in capsys.readouterr().err
    assert main(["ablate", "--grid", "lab-heads"]) == 2
    assert "--out required" in capsys.readouterr().err
