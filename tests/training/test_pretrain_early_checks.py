"""Checks that refuse a pretraining run before anything is written: a block longer than the preset's
position table, with the fix named (the documented ``--preset tiny`` examples)."""

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
