"""--reuse: a run of another harness folder that is the same run is copied, not retrained, and gives
the row that training it here gives; a different configuration or tokenizer is never taken."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from qkv.experiments.runner import AblationConfig, run_ablation
from qkv.cli import main

BASE = {"preset": "tiny", "model": {"dropout": 0.0}, "vocab_size": 300, "max_len": 16, "batch_size": 6,
        "warmup_steps": 2, "eval_batches": 2, "eval_batch_size": 8, "log_every": 1}
FIRST = {"name": "first", "question": "Q/K/V maps on tiny?", "base": BASE,
         "variants": {"qkv": {}, "raw": {"model": {"qkv_proj": False}}},
         "stats": ["saturation"], "early_steps": 3}
# `maps` is `qkv` under another name; `raw-lr2` differs from `raw` in the learning rate only
SECOND = {"name": "second", "question": "The same maps, another name?", "base": BASE,
          "variants": {"maps": {}, "raw-lr2": {"model": {"qkv_proj": False}, "lr_scale": 2.0}},
          "stats": ["saturation", "self_attention_share"], "early_steps": 3}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path / "cache"))


def _grid(tmp_path: Path, grid: dict, **changes) -> str:
    path = tmp_path / f"{grid['name']}.json"
    path.write_text(json.dumps({**grid, **changes}))
    return str(path)


def _config(tmp_path, grid: str, out: str, **kw) -> AblationConfig:
    return AblationConfig(grid=grid, corpus=("dataset:pydoc",), out=str(tmp_path / out), seeds=2, threads=1,
                          overrides={"steps": 4}, **kw)


def _rows(out: Path) -> dict[tuple[str, str], dict]:
    return {(r["variant"], r["seed"]): r for r in csv.DictReader((out / "results.csv").open())}


def test_the_same_run_is_copied_and_measured_with_this_grids_statistics(tmp_path, cache):
    first = run_ablation(_config(tmp_path, _grid(tmp_path, FIRST), "a"), log=lambda m: None)
    assert first.status == "complete"
    logs: list[str] = []
    second = run_ablation(_config(tmp_path, _grid(tmp_path, SECOND), "b", reuse=(str(tmp_path / "a"),)),
                          log=logs.append)
    assert second.status == "complete", second.errors
    reused = [line for line in logs if line.startswith("reuse ")]
    assert [line.split(":")[0] for line in reused] == ["reuse maps seed 0", "reuse maps seed 1"]
    assert "maps seed 0: training" not in logs and "raw-lr2 seed 0: training" in logs
    a, b = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    for seed in ("0", "1"):
        mine, theirs = b[("maps", seed)], a[("qkv", seed)]
        for key in ("eval_loss", "accuracy", "params", "max_weight_early", "qk_grad_norm_early",
                    "max_weight_final", "tokens_per_s"):
            assert mine[key] == theirs[key], key
        assert float(mine["self_share"]) > 0  # a statistic the first grid did not measure
        assert mine["reused_from"] == str(tmp_path / "a" / "runs" / "qkv" / f"seed{seed}")
        assert b[("raw-lr2", seed)]["reused_from"] == ""
    run = tmp_path / "b" / "runs" / "maps" / "seed0"
    meta = json.loads((run / "run.json").read_text())
    assert meta["train_config"]["out"] == str(run) and meta["reused_from"].endswith("qkv/seed0")
    assert meta["train_config"]["tokenizer"] == str(tmp_path / "b" / "tokenizer")
    assert not list(run.parent.glob(".*reuse-tmp"))
    md = (tmp_path / "b" / "results.md").read_text()
    assert f"- `maps` seeds 0, 1 from `{tmp_path / 'a' / 'runs' / 'qkv'}`" in md
    # trained here instead, the copied runs give the same numbers: reuse changes nothing but the time
    fresh = run_ablation(_config(tmp_path, _grid(tmp_path, SECOND), "c", variants=("maps",)),
                         log=lambda m: None)
    c = _rows(fresh.out)
    for seed in ("0", "1"):
        assert c[("maps", seed)]["eval_loss"] == b[("maps", seed)]["eval_loss"]
        assert c[("maps", seed)]["self_share"] == b[("maps", seed)]["self_share"]
    # rerunning skips everything; the copies stay
    again: list[str] = []
    run_ablation(_config(tmp_path, _grid(tmp_path, SECOND), "b", reuse=(str(tmp_path / "a"),)), log=again.append)
    assert sum(line.startswith("skip ") for line in again) == 4 and not any("reuse " in x for x in again)


def test_other_tokenizer_other_config_or_missing_early_stats_are_not_reused(tmp_path, cache):
    run_ablation(_config(tmp_path, _grid(tmp_path, FIRST, stats=[]), "a"), log=lambda m: None)
    # no early statistics recorded in `a`, so `maps` (which needs them) must be trained
    logs: list[str] = []
    run_ablation(_config(tmp_path, _grid(tmp_path, SECOND), "b", reuse=(str(tmp_path / "a"),)), log=logs.append)
    assert not any(line.startswith("reuse ") for line in logs) and "maps seed 0: training" in logs
    # another vocabulary: another tokenizer, nothing reusable
    logs = []
    other = _grid(tmp_path, SECOND, base={**BASE, "vocab_size": 280}, stats=[])
    run_ablation(_config(tmp_path, other, "c", reuse=(str(tmp_path / "a"),)), log=logs.append)
    assert any("has another tokenizer or text" in line for line in logs)
    assert not any(line.startswith("reuse ") for line in logs)


def test_a_folder_that_is_not_a_harness_folder_is_an_error(tmp_path, cache, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a harness folder"):
        run_ablation(_config(tmp_path, _grid(tmp_path, FIRST), "x", reuse=(str(tmp_path / "empty"),)))
    assert main(["ablate", "--grid", "heads", "--corpus", "dataset:pydoc", "--out", str(tmp_path / "o"),
                 "--reuse", str(tmp_path / "nowhere")]) == 2
    assert "--reuse" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "o").exists()
