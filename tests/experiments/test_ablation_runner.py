"""The harness end to end on `tiny`: identical tables from identical seeds, skip and resume after
SIGKILL, statistics per variant, the command line."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qkv.experiments.runner import AblationConfig, run_ablation
from qkv.cli import main

GRID = {
    "name": "tinytest",
    "question": "Do Q/K/V maps matter on tiny?",
    "base": {"preset": "tiny", "model": {"dropout": 0.0}, "vocab_size": 300, "max_len": 16, "batch_size": 6,
             "warmup_steps": 2, "eval_batches": 2, "eval_batch_size": 8, "log_every": 1},
    "variants": {"qkv": {}, "raw": {"model": {"qkv_proj": False}}},
    "stats": ["self_attention_share", "saturation", "heads"],
    "early_steps": 3,
    "extra_eval": {"length_factor": 2},
}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _grid_file(tmp_path: Path, **changes) -> str:
    path = tmp_path / "tinytest.json"
    path.write_text(json.dumps({**GRID, **changes}))
    return str(path)


def _csv_without_timing(path: Path) -> list[dict]:
    rows = list(csv.DictReader(path.open()))
    for r in rows:
        r.pop("tokens_per_s")
    return rows


def _table_without_timing(table: str) -> list[list[str]]:
    return [line.split("|")[:-2] for line in table.splitlines()]  # tokens/s is the last column


def test_same_seeds_give_identical_tables_with_the_statistics(tmp_path, cache):
    grid = _grid_file(tmp_path)
    results = []
    for name in ("a", "b"):
        logs: list[str] = []
        cfg = AblationConfig(grid=grid, corpus=("dataset:pydoc",), out=str(tmp_path / name), seeds=2,
                             threads=1,
                             overrides={"steps": 4})
        results.append(run_ablation(cfg, log=logs.append))
        assert results[-1].status == "complete" and not results[-1].missing
    a, b = results
    assert _table_without_timing(a.table) == _table_without_timing(b.table)
    assert _csv_without_timing(a.out / "results.csv") == _csv_without_timing(b.out / "results.csv")
    rows = _csv_without_timing(a.out / "results.csv")
    order = [("qkv", "0"), ("raw", "0"), ("qkv", "1"), ("raw", "1")]
    assert [(r["variant"], r["seed"]) for r in rows] == order
    # the statistics, per variant: self share above chance on raw embeddings; saturation; 2× length
    for r in rows:
        assert 0 < float(r["chance"]) < 1 and 0 < float(r["self_share"]) <= 1
        assert r["early_steps"] == "3" and float(r["grad_norm_early"]) > 0
        assert 0 < float(r["max_weight_early"]) <= 1 and 0 < float(r["max_weight_final"]) <= 1
        assert r["long_len"] == "32" and float(r["long_eval_loss"]) > 0
        assert 0 < float(r["max_prev_share"]) <= 1 and 0 < float(r["max_next_share"]) <= 1
        assert 0 < float(r["head_entropy"]) <= float(r["uniform_entropy"]) + 1e-6
        assert 0 <= int(r["specialised_heads"]) <= 2 * 3  # tiny: 2 layers × 3 heads
    assert all(r["qk_grad_norm_early"] == "nan" for r in rows if r["variant"] == "raw")
    raw = [float(r["self_share"]) for r in rows if r["variant"] == "raw"]
    qkv = [float(r["self_share"]) for r in rows if r["variant"] == "qkv"]
    chance = float(rows[0]["chance"])  # 1/16: every probe block is full
    assert min(raw) > 3 * chance > max(qkv)  # the Zhihu argument, visible after 4 steps
    md = (a.out / "results.md").read_text()
    for col in ("self share", "max weight, steps 1–3", "‖∇Q,K‖, steps 1–3", "loss at 2× length", "tokens/s"):
        assert col in a.table
    assert " ± " in a.table and "2/2" in a.table
    assert "Do Q/K/V maps matter on tiny?" in md and "loss_curves.png" in md
    assert (a.out / "loss_curves.png").stat().st_size > 1000
    assert "## Ranking over seeds" in md and "- seed 1: " in md and "lower than `qkv` in" in md
    # the ranking at each held-out evaluation of the runs, the same in both folders
    def over_budget(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith(("| 1 |", "| 2 |", "| 3 |", "| 4 |",
                                                                        "Resolved pairs"))]
    over = over_budget(md)
    assert over[-2].startswith("| 4 | ") and over[-1].startswith("Resolved pairs at the end: ")
    assert over == over_budget((b.out / "results.md").read_text())
    # a subset of the variants over the same folder: nothing to train, a report of that variant only
    logs = []
    sub = run_ablation(AblationConfig(grid=grid, corpus=("dataset:pydoc",), out=str(tmp_path / "a"), seeds=2,
                                      threads=1, overrides={"steps": 4}, variants=("raw",)), log=logs.append)
    assert sub.status == "complete" and list(sub.grid.variants) == ["raw"]
    assert sum(line.startswith("skip raw") for line in logs) == 2 and not any("[1/" in line for line in logs)
    assert [line.split("|")[1].strip() for line in sub.table.splitlines()[2:]] == ["raw"]
    assert _table_without_timing(sub.table)[2] == _table_without_timing(a.table)[3]
    assert json.loads((tmp_path / "a" / "ablation.json").read_text())["variants"] == ["raw"]
    # parameters stated per variant: the raw variant lacks the 2 layers' fused C→3C maps (24·72 + 72 each)
    params = {r["variant"]: int(r["params"]) for r in rows}
    assert params["qkv"] - params["raw"] == 2 * (24 * 72 + 72)
    # the same tokenizer and held-out text for every run
    shared = json.loads((a.out / "shared.json").read_text())
    for run in (a.out / "runs").glob("*/seed*/run.json"):
        cfg = json.loads(run.read_text())["train_config"]
        assert cfg["tokenizer"] == shared["data_fields"]["tokenizer"]
        assert cfg["eval_corpus"] == shared["data_fields"]["eval_corpus"]


def test_sigkill_then_rerun_skips_the_finished_variant_and_resumes_the_other(tmp_path, cache):
    grid = _grid_file(tmp_path, variants={"qkv": {}, "raw": {"model": {"qkv_proj": False}, "steps": 400}},
                      stats=[], extra_eval={})
    out = tmp_path / "out"
    args = ["--grid", grid, "--corpus", "dataset:pydoc", "--out", str(out), "--seeds", "1", "--steps", "6",
            "--threads", "1", "--set", "save_every=5"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    console = tmp_path / "console.txt"
    with open(console, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "qkv", "ablate", *args], env=env, stdout=fh,
                                stderr=subprocess.STDOUT)
    first = out / "runs" / "qkv" / "seed0" / "result.json"
    second = out / "runs" / "raw" / "seed0"
    deadline = time.time() + 300  # generous: a loaded 2-core machine starts the subprocess slowly
    try:
        while not (second / "checkpoints" / "LATEST").is_file():
            assert proc.poll() is None, console.read_text()
            assert time.time() < deadline, "the harness did not reach the second variant in time"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert first.is_file() and not (second / "result.json").exists()
    assert (second.parent / "seed0.lock").is_file()  # left behind by the killed process
    stamp = first.stat().st_mtime_ns
    logs: list[str] = []
    rerun = AblationConfig(grid=grid, corpus=("dataset:pydoc",), out=str(out), seeds=1, threads=1,
                           overrides={"steps": 6, "save_every": 5})
    result = run_ablation(rerun, log=logs.append)
    assert result.status == "complete", logs
    assert "skip qkv seed 0: finished" in logs
    assert "raw seed 0: resuming from its last checkpoint" in logs
    assert first.stat().st_mtime_ns == stamp  # not retrained
    assert json.loads((second / "result.json").read_text())["steps"] == 400
    metrics = [json.loads(x) for x in (second / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if "loss" in r] == list(range(1, 401))
    again: list[str] = []
    run_ablation(rerun, log=again.append)
    assert "skip qkv seed 0: finished" in again and "skip raw seed 0: finished" in again
    changed = AblationConfig(grid=grid, corpus=("dataset:pydoc",), out=str(out), seeds=1, threads=1,
                             overrides={"steps": 7, "save_every": 5})
    with pytest.raises(ValueError, match="holds a run with another configuration"):
        run_ablation(changed, log=again.append)


@pytest.mark.slow
def test_parallel_processes_give_the_serial_numbers(tmp_path, cache):
    grid = _grid_file(tmp_path)
    tables = []
    for name, jobs in (("serial", 1), ("parallel", 2)):
        cfg = AblationConfig(grid=grid, corpus=("dataset:pydoc",), out=str(tmp_path / name), seeds=1,
                             jobs=jobs, threads=1, overrides={"steps": 4})
        result = run_ablation(cfg, log=lambda m: None)
        assert result.status == "complete", result.errors
        tables.append(_csv_without_timing(result.out / "results.csv"))
    assert tables[0] == tables[1]
    assert (tmp_path / "parallel" / "logs" / "qkv-seed0.log").is_file()


def test_cli_help_list_and_errors(tmp_path, capsys, cache):
    with pytest.raises(SystemExit) as e:
        main(["ablate", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--grid", "--list-grids", "--corpus", "--eval-corpus", "--steps", "--seeds", "--out",
                 "--jobs", "--batch-size", "--max-len", "--preset", "--set", "--variants", "--reuse"):
        assert flag in text, flag
    assert main(["ablate", "--list-grids"]) == 0
    listing = capsys.readouterr().out
    assert "projections: qkv, no-qkv, no-qkv-no-out" in listing and "positions:" in listing
    assert main(["ablate", "--grid", "nope", "--corpus", "dataset:pydoc", "--out", str(tmp_path / "o")]) == 2
    assert "unknown grid 'nope'" in capsys.readouterr().err
    assert main(["ablate", "--grid", "heads"]) == 2
    assert "--corpus, --out required" in capsys.readouterr().err
    assert main(["ablate", "--grid", "heads", "--corpus", "dataset:pydoc", "--out", str(tmp_path / "o"),
                 "--set", "model.heads=3"]) == 2
    assert "unknown model key 'heads'" in capsys.readouterr().err
    assert main(["ablate", "--grid", "heads", "--corpus", "dataset:pydoc", "--out", str(tmp_path / "o"),
                 "--variants", "h2,h3"]) == 2
    assert "grid 'heads' has no variant 'h3'; its variants: h1, h2, h4, h8" in capsys.readouterr().err
    assert main(["ablate", "--grid", "heads", "--corpus", "dataset:pydoc", "--out", str(tmp_path / "o"),
                 "--variants", ","]) == 2
    assert "--variants ',': give variant names" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # errors stop before anything is written
