"""Sizes, lengths, counts, rates, times and devices are checked before any work starts, with the limit
named: for every subcommand, absurd values (zero, negative, 10**9, 1e30, more threads than CPUs, a CUDA
device that is not there) are refused with one ``qkv <command>: error:`` line naming the limit, exit 2,
no traceback, nothing written — and quickly (a case that starts working instead fails at :data:`TIMEOUT`
seconds, it does not hang the suite). The walker fails when a subcommand has no row.

To add a subcommand, add its row to :func:`_rows`: ``command: [(arguments, fragment of the message)]``.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from qkv.cli import build_parser, main

#: seconds a case may take; the refusals take well under a second (a model folder is read at most)
TIMEOUT = 60
B = "1000000000"  # 10**9
CPUS = "this process may use"  # the threads/jobs limit: the machine's CPUs


def _rows(tmp: Path, model: Path, index: Path) -> dict[str, list[tuple[list[str], str]]]:
    """One row per subcommand: its cases, each ``(argv after the command, fragment naming the limit)``."""
    text = tmp / "docs.txt"
    text.write_text("one document\nanother one\n")
    rows = tmp / "rows.jsonl"
    rows.write_text("".join(f'{{"text": "document {i}", "label": "{"ab"[i % 2]}"}}\n' for i in range(8)))
    m, t, out = str(model), str(text), str(tmp / "out")
    pre = ["--corpus", t, "--preset", "tiny", "--max-len", "19", "--out", out]
    fine = [m, "--task", "sequence-classification", "--train", str(rows), "--out", out]
    grid = ["--grid", "heads", "--corpus", t, "--out", out]
    lab = ["seq2seq", "--task", "reverse", "--out", out]
    tune = [m, "--corpus", t, "--out", out]
    return {
        "demo": [(["--minutes", "1e30", "--out", out], "(0, 1440]"),
                 (["--minutes", "-1", "--out", out], "(0, 1440]")],
        "convert": [([m, out, "--to", "sentence-transformers", "--max-len", B], "must be in [3, 32]")],
        "pretrain": [([*pre, "--steps", "1000000000000"], "above 10,000,000"),
                     ([*pre, "--time-budget", "1e30"], "above 43,200"),
                     ([*pre, "--time-budget", "-1"], "positive number of minutes"),
                     ([*pre, "--batch-size", B], "above 4,194,304"),
                     ([*pre, "--batch-size", "0"], "batch_size=0 must be an int ≥ 1"),
                     ([*pre, "--eval-batch-size", B], "above 4,194,304"),
                     ([*pre, "--grad-accum", B], "above 100,000"),
                     ([*pre, "--eval-every", "-5"], "eval_every=-5 must be an int ≥ 1"),
                     ([*pre, "--threads", "10000"], CPUS),
                     ([*pre, "--device", "cuda:7"], "allowed: auto, cpu, cuda"),
                     (["--corpus", t, "--preset", "tiny", "--out", out, "--max-len", B], "or max_len")],
        "finetune": [([*fine, "--steps", "1000000000000"], "above 10,000,000"),
                     ([*fine, "--epochs", "1e12"], "above 10,000"),
                     ([*fine, "--batch-size", B], "above 4,194,304"),
                     ([*fine, "--grad-accum", B], "above 100,000"),
                     ([*fine, "--threads", "10000"], CPUS),
                     ([*fine, "--time-budget", "-1"], "positive number of minutes"),
                     ([*fine, "--max-len", B], "or max_len"), ([*fine, "--max-len", "33"], "exceeds the model's window (32)")],
        "predict": [([m, t, "--out", out + ".jsonl", "--device", "cuda:7"], "'cuda:7'"),
                    ([m, t, "--out", out + ".jsonl", "--batch-size", "0"], "--batch-size 0 must be ≥ 1")],
        "analyze": [([m, "--corpus", t, "--out", out, "--max-len", B], "window of 32 positions"),
                    ([m, "--corpus", t, "--out", out, "--batch-size", "0"], "batch_size=0 must be ≥ 1")],
        "inspect": [([m, "a text", "--out", out, "--flow-max-tokens", "0"], "flow")],
        "findings": [(["kobayashi", m, "--data", t, "--out", out, "--step", "0"], "step ≥ 1")],
        "embed": [([m, t, "--out", out + ".npy", "--max-len", B], "must be in [3, 32]"),
                  ([m, t, "--out", out + ".npy", "--batch-size", "0"], "batch_size=0 must be an int ≥ 1"),
                  ([m, t, "--out", out + ".npy", "--device", "cuda:7"], "'cuda:7'")],
        "index": [([m, t, "--out", out, "--max-len", B], "must be in [3, 32]"),
                  ([m, t, "--out", out, "--index", "faiss-hnsw", "--hnsw-m", "0"], "hnsw_m=0 must be an int ≥ 1")],
        "search": [([str(index), "a query", "-k", "0"], "k=0"),
                   ([str(index), "a query", "--device", "cuda:7"], "'cuda:7'")],
        "train-embeddings": [([*tune, "--steps", "1000000000000"], "above 10,000,000"),
                             ([*tune, "--batch-size", B], "above 4,194,304"),
                             ([*tune, "--max-len", B], "or max_len"),
                             ([*tune, "--time-budget", "1e30"], "above 43,200")],
        "eval-embeddings": [([m, "--dataset", "reuters8", "--k", "0"], "--k 0"),
                            ([m, "--dataset", "reuters8", "--batch-size", "0"], "batch_size=0 must be an int ≥ 1"),
                            ([m, "--dataset", "reuters8", "--device", "cuda:7"], "'cuda:7'")],
        "ablate": [([*grid, "--seeds", B], "above 1,000"),
                   ([*grid, "--jobs", "10000"], CPUS),
                   ([*grid, "--threads", "10000"], CPUS),
                   ([*grid, "--steps", "1000000000000"], "above 10,000,000"),
                   (["--grid", "lab-heads", "--out", out, "--steps", "1000000000000"], "above 10,000,000")],
        "generate": [([m, "hello", "--sliding", "--max-new-tokens", B], "above 100,000"),
                     ([m, "hello", "--top-k", "-1"], "--top-k must be an int ≥ 1")],
        "translate": [([m, "hello", "--beams", B], "above 256"),
                      ([m, "hello", "--max-new-tokens", "0"], "--max-new-tokens 0: give at least 1")],
        "fill-mask": [([m, "a [MASK]", "--top-k", B], "above the model's vocabulary"),
                      ([m, "a [MASK]", "--top-k", "-1"], "--top-k -1: give at least 1")],
        "lab": [([*lab, "--steps", "1000000000000"], "above 10,000,000"),
                ([*lab, "--time-budget", "1e30"], "above 43,200"),
                ([*lab, "--max-len", "100000000"], "above 1,024")],
        "caption": [([m, t, "--max-new-tokens", B], "above 100,000"),
                    ([m, t, "--max-new-tokens", "0"], "--max-new-tokens 0: give at least 1")],
        "export": [([m, "--onnx", out + ".onnx", "--opset", "999"], "[18, 28]")],
        "serve": [([m, "--port", "70000"], "[0, 65535]"),
                  ([m, "--max-new-tokens", B], "above 100,000"),
                  ([m, "--batch-tokens", "1000000000000"], "above 4,194,304")],
    }


@pytest.fixture(scope="module")
def index(tmp_path_factory, model_folder) -> Path:
    """A two-document exact index of the tiny model."""
    root = tmp_path_factory.mktemp("limits-index")
    (root / "docs.txt").write_text("one document\nanother one\n")
    assert main(["index", str(model_folder), str(root / "docs.txt"), "--out", str(root / "index"),
                 "--no-progress"]) == 0
    return root / "index"


class _TooLong(BaseException):
    """A case ran past :data:`TIMEOUT`: it started working instead of refusing (not an ``Exception``, so
    that the command line's handler does not report it as an error)."""


def _alarm(signum, frame):
    raise _TooLong()


def _run(argv: list[str], capsys) -> tuple[object, str]:
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIMEOUT)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors (a bad type): exit 2 with usage
        code = e.code
    except _TooLong:
        code = f"still running after {TIMEOUT} s"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, capsys.readouterr().err


def test_every_subcommand_has_a_limits_row(tmp_path, model_folder):
    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    rows = _rows(tmp_path, model_folder, tmp_path / "index")
    assert commands <= set(rows), f"no limits row for: {sorted(commands - set(rows))}"
    assert all(rows[c] for c in commands)


def test_absurd_sizes_are_refused_before_work_with_the_limit_named(tmp_path, model_folder, index, capsys,
                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    failures = []
    for command, cases in _rows(tmp_path, model_folder, index).items():
        for args, fragment in cases:
            code, err = _run([command, *args], capsys)
            lines = [x for x in err.splitlines() if x.startswith(f"qkv {command}: error:")]
            if code != 2 or "Traceback" in err or len(lines) != 1 or fragment not in lines[0]:
                failures.append(f"{command} {' '.join(args[-2:])}: exit {code}, stderr {err[-300:]!r}")
    assert not failures, "\n".join(failures)
    assert not any(p.name.startswith("out") for p in tmp_path.iterdir())  # nothing written
