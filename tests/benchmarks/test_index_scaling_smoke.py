"""benchmarks/index.py and benchmarks/scaling.py end to end on tiny sizes (the figures in
docs/embeddings.md and docs/scaling.md come from these scripts)."""

from __future__ import annotations

import pytest
from bench_support import load_script


def test_index_benchmark_prints_recall_and_latency_per_index_type(capsys):
    pytest.importorskip("faiss", reason="faiss-cpu is not installed: pip install faiss-cpu (make test installs it)")
    assert load_script("index").main(["--sizes", "3000", "--dim", "24", "--queries", "5", "--no-real"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| synthetic")]
    assert [row.split("|")[3].strip() for row in table] == ["exact"] + ["faiss-ivf"] * 2 + ["faiss-hnsw"] * 2
    for row in table:
        recall = float(row.split("|")[7])
        assert 0.0 <= recall <= 1.0
    assert float(table[0].split("|")[7]) == 1.0


@pytest.mark.slow
def test_scaling_benchmark_runs_every_arm_to_the_same_loss(capsys):
    assert load_script("scaling").main(["--preset", "tiny", "--steps", "7", "--batch", "2", "--max-len", "16",
                                      "--model", '{"dropout": 0.0}']) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "tokens/s" not in line]
    assert len(rows) == 5
    assert len({row.split("|")[4].strip() for row in rows}) == 1  # the same last loss in every arm
