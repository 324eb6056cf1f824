"""Checks before a pretraining run: a block longer than the preset's position table refused before anything
is written, with the fix named (the documented ``--preset tiny`` examples); the tiny preset on text warned about."""

from __future__ import annotations

from qkv.cli import main


def test_a_block_beyond_the_position_table_is_refused_first_with_the_fix(tmp_path, capsys):
    docs = tmp_path / "docs.txt"
    docs.write_text("one short document\nanother short document\n" * 20)
    out = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(docs), "--out", str(out), "--preset", "tiny", "--steps", "1",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["qkv pretrain: error: max_len=128 exceeds the model's position table (19); pass --max-len 19 "
                   "(or less), or a preset with a longer table (--preset cpu-small: 512)"]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["docs.txt"]


def test_the_tiny_preset_on_text_is_warned_about(tmp_path, capsys):
    docs = tmp_path / "docs.txt"
    docs.write_text("".join(f"document number {i} about cats and dogs\n" for i in range(40)))
    assert main(["pretrain", "--corpus", str(docs), "--out", str(tmp_path / "run"), "--preset", "tiny",
                 "--max-len", "19", "--steps", "2", "--warmup-steps", "1", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "qkv: warning: --preset tiny is a test-size model" in err and "--preset cpu-small" in err
    assert "warm-up" not in err
