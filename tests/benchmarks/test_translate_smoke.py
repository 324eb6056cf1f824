"""Smoke test: benchmarks/translate.py imports, parses its flags and runs end to end (--quick); the
Marian weights it reads agree with transformers token for token."""

from __future__ import annotations

import json

import pytest
from bench_support import load_script, missing_flags

pytest.importorskip("transformers")


def test_help_lists_the_flags():
    flags = ("--quick", "--size", "--batch", "--new-tokens", "--json")
    assert missing_flags(load_script("translate"), *flags) == []


def test_quick_run_end_to_end(tmp_path, capsys):
    bench = load_script("translate")
    out = tmp_path / "tr.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    assert "ratio qkv/hf" in capsys.readouterr().out  # timings at this size are noise; it must run
    rows = json.loads(out.read_text())["rows"]
    assert [r["beams"] for r in rows] == [1, 4] and all(r["tokens_agree"] for r in rows)
