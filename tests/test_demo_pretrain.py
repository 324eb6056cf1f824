"""qkv demo: never deletes a folder it did not make; a tiny end-to-end run shows what it learned."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qkv import demo_pretrain as demo
from qkv.demo_pretrain import DEMO_MARK, DemoError, claim_demo_dir


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path / "cache"))


def test_claim_uses_a_missing_or_empty_folder(tmp_path):
    claim_demo_dir(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    claim_demo_dir(tmp_path / "empty")
    assert (tmp_path / "empty").is_dir()


@pytest.mark.parametrize("content", ["user-files", "other-qkv-run", "file"])
def test_claim_refuses_a_folder_the_demo_did_not_make_and_leaves_it_untouched(tmp_path, content):
    out = tmp_path / "out"
    if content == "file":
        out.write_text("mine")
    else:
        out.mkdir()
        (out / "notes.txt").write_text("precious")
        if content == "other-qkv-run":
            (out / "run.json").write_text(json.dumps({"format": "qkv-run", "status": "complete"}))
    before = sorted(p.name for p in out.iterdir()) if out.is_dir() else out.read_text()
    with pytest.raises(DemoError, match="is a file|was not made by qkv demo; it is left untouched"):
        claim_demo_dir(out)
    after = sorted(p.name for p in out.iterdir()) if out.is_dir() else out.read_text()
    assert before == after
    if out.is_dir():
        assert (out / "notes.txt").read_text() == "precious"


def test_claim_replaces_the_demos_own_run(tmp_path, capsys):
    out = tmp_path / "demo"
    out.mkdir()
    (out / DEMO_MARK).write_text("{}")
    (out / "run.json").write_text("{}")
    claim_demo_dir(out)
    assert not out.exists() and "replacing the previous demo run" in capsys.readouterr().out


def test_the_cli_refuses_with_one_line_and_exit_2(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    for args in (["--out", str(out)], ["--out", str(tmp_path / "x"), "--minutes", "nan"],
                 ["--out", str(tmp_path / "x"), "--minutes", "-1"]):
        p = subprocess.run([sys.executable, "-m", "qkv", "demo", *args], capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("qkv demo: error: ") and "Traceback" not in p.stderr
    assert (out / "thesis.tex").read_text() == "years of work" and not (tmp_path / "x").exists()


def test_a_tiny_demo_run_reports_fill_mask_heads_and_viewer_and_can_be_rerun(tmp_path, monkeypatch, capsys):
    from qkv.training.config import TrainConfig

    def tiny(out, *, minutes, seed=0, precision="auto"):
        return TrainConfig(corpus=("dataset:pydoc",), out=out, preset="tiny", model={"max_len": 40, "dropout": 0.0},
                           vocab_size=300, max_len=24, batch_size=8, time_budget=minutes, eval_every=20,
                           eval_batches=2, eval_batch_size=8, save_every=1000, progress=False, precision=precision)

    monkeypatch.setattr(demo, "demo_config", tiny)
    monkeypatch.setattr(demo, "INSPECT_SENTENCE", "the class of the object")
    out = tmp_path / "demo"
    sentences = [("the [MASK] of the object", "class"), ("return the [MASK]", "value"), ("a [MASK]", "xylophone")]
    figures = demo.run_pretrain_demo(str(out), minutes=0.05, sentences=sentences)
    text = capsys.readouterr().out
    assert (out / DEMO_MARK).is_file() and (out / "inspect" / "viewer.html").is_file()
    assert (out / "inspect" / "attention_layer_1.png").is_file() and (out / "curve.png").is_file()
    saved = json.loads((out / "demo.json").read_text())
    assert saved["accuracy"] == figures["accuracy"] and len(saved["heads"]["prev_share"]) == 2
    assert [f["answer"] for f in saved["fill_mask"]] == ["class", "value"]
    assert "skipped, not one token of this vocabulary: xylophone" in text
    for part in ("fill in the blank", "heads (mean attention", "attention viewer", "xdg-open", "qkv inspect"):
        assert part in text
    (out / "my-notes.txt").write_text("mine")  # a file the demo did not write: the folder is not replaced
    with pytest.raises(DemoError, match="also holds my-notes.txt"):
        demo.run_pretrain_demo(str(out), minutes=0.05, sentences=sentences)
    assert (out / "my-notes.txt").read_text() == "mine" and (out / "demo.json").is_file()
    (out / "my-notes.txt").unlink()
    demo.run_pretrain_demo(str(out), minutes=0.05, sentences=sentences)
    assert "replacing the previous demo run" in capsys.readouterr().out and (out / "demo.json").is_file()
