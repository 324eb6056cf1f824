"""Smoke test: benchmarks/translate.py imports, parses its flags and runs end to end (--quick); the
Marian weights it reads agree with transformers token for token."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "translate.py"


def _load():
    spec = importlib.util.spec_from_file_location("qkv_bench_translate", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_lists_the_flags():
    text = _load().build_parser().format_help()
    for flag in ("--quick", "--size", "--batch", "--new-tokens", "--json"):
        assert flag in text


def test_quick_run_end_to_end(tmp_path, capsys):
    bench = _load()
    out = tmp_path / "tr.json"
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--quick", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert "ratio qkv/hf" in capsys.readouterr().out  # timings at this size are noise; it must run
    rows = json.loads(out.read_text())["rows"]
    assert [r["beams"] for r in rows] == [1, 4] and all(r["tokens_agree"] for r in rows)
