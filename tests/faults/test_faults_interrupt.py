"""Ctrl-C at any moment after start-up is one line and exit 130, for every command: interrupted at the
start of the command line (nothing parsed), after its parser is built (its library imported) and the
arguments parsed, and while the command runs — never a traceback, nothing half-written. SIGTERM likewise:
one line, exit 143."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faults_support import env

from qkv.cli import build_parser

POINTS = ("cli.start", "cli.parsed")


def _commands(tmp: Path, model: Path) -> dict[str, list[str]]:
    text = tmp / "docs.txt"
    text.write_text("one document\nanother one\n")
    return {
        "convert": ["convert", str(model), str(tmp / "out-convert")],
        "export": ["export", str(model), "--onnx", str(tmp / "out.onnx")],
        "embed": ["embed", str(model), str(text), "--out", str(tmp / "out.npy")],
        "index": ["index", str(model), str(text), "--out", str(tmp / "out-index")],
        "search": ["search", str(tmp / "no-index"), "a query"],
        "predict": ["predict", str(model), str(text), "--out", str(tmp / "out.jsonl")],
        "inspect": ["inspect", str(model), "one document", "--out", str(tmp / "out-inspect")],
        "analyze": ["analyze", str(model), "--corpus", str(text), "--out", str(tmp / "out-analyze")],
        "generate": ["generate", str(model), "hello"],
        "pretrain": ["pretrain", "--corpus", str(text), "--preset", "tiny", "--out", str(tmp / "out-pretrain")],
        "finetune": ["finetune", str(model), "--task", "regression", "--train", str(text), "--out", str(tmp / "f")],
        "demo": ["demo", "--out", str(tmp / "out-demo")],
        "lab": ["lab", "seq2seq", "--task", "reverse", "--out", str(tmp / "out-lab")],
        "ablate": ["ablate", "--grid", "heads", "--corpus", str(text), "--out", str(tmp / "out-ablate")],
        "serve": ["serve", str(model), "--port", "0"],
        "train-embeddings": ["train-embeddings", str(model), "--corpus", str(text), "--out", str(tmp / "out-te")],
        "eval-embeddings": ["eval-embeddings", str(model), "--dataset", str(text)],
        "fill-mask": ["fill-mask", str(model), "a [MASK] document"],
        "findings": ["findings", "kobayashi", str(model), "--data", str(text), "--out", str(tmp / "out-findings")],
        "translate": ["translate", str(model), "hello", "--output", str(tmp / "out-translate.txt")],
        "caption": ["caption", str(model), str(text)],
    }


def _interrupt_at(argv: list[str], point: str, tmp: Path, sig=signal.SIGINT) -> subprocess.CompletedProcess:
    mark = tmp / "mark"
    mark.unlink(missing_ok=True)
    e = env(tmp, QKV_FAULT_PAUSE=f"{point}:60", QKV_FAULT_MARK=str(mark))
    proc = subprocess.Popen([sys.executable, "-m", "qkv", *argv], env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal's
    deadline = time.time() + 120
    while not mark.exists():
        assert proc.poll() is None, f"{argv[0]} ended before {point}: {proc.communicate()[1][-400:]}"
        assert time.time() < deadline, f"{argv[0]} never reached {point}"
        time.sleep(0.01)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.parametrize("point", POINTS)
def test_ctrl_c_at_start_up_is_one_line_and_exit_130(point, tmp_path, model_folder):
    commands = _commands(tmp_path, model_folder)
    failures = []
    for name in sorted(commands):
        done = _interrupt_at(commands[name], point, tmp_path)
        lines = [x for x in done.stderr.splitlines() if x.strip()]
        if done.returncode != 130 or "Traceback" in done.stderr or len(lines) != 1 or "interrupted" not in lines[0]:
            failures.append(f"{name} at {point}: exit {done.returncode}, stderr {done.stderr[-300:]!r}")
    assert not failures, "\n".join(failures)
    assert not any(p.name.startswith("out") for p in tmp_path.iterdir())  # nothing written


def test_sigterm_after_start_up_is_one_line_and_exit_143(tmp_path, model_folder):
    """SIGTERM (what a scheduler or `kill` sends) ends every command as Ctrl-C does: cleanly, one line, nothing
    half-written; exit 143 (128 + 15)."""
    commands = _commands(tmp_path, model_folder)
    failures = []
    for name in sorted(commands):
        done = _interrupt_at(commands[name], "cli.parsed", tmp_path, signal.SIGTERM)
        lines = [x for x in done.stderr.splitlines() if x.strip()]
        if done.returncode != 143 or "Traceback" in done.stderr or len(lines) != 1 or "terminated" not in lines[0]:
            failures.append(f"{name}: exit {done.returncode}, stderr {done.stderr[-300:]!r}")
    assert not failures, "\n".join(failures)
    assert not any(p.name.startswith("out") for p in tmp_path.iterdir())


def test_every_command_has_an_interrupt_case(tmp_path, model_folder):
    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    assert set(_commands(tmp_path, model_folder)) == commands  # a new command needs a case here


@pytest.mark.parametrize("delay", [0.0, 0.4, 0.8, 1.2, 1.6])
def test_ctrl_c_in_the_first_seconds_of_embed_is_one_line_or_a_complete_output(delay, tmp_path, model_folder):
    """A real SIGINT ``delay`` seconds after qkv's first line runs (importing, loading the model, tokenising,
    the first batches): exit 130 with one line — never a C++ abort (it was rc −6), never an end by the
    signal itself (−2: the interpreter's own mark of a KeyboardInterrupt seen inside a library, see
    :func:`qkv.cli.exit_with`) — or, when embed was faster, exit 0 with the output complete; never a
    half-written file."""
    text = tmp_path / "docs.txt"
    text.write_text("".join(f"document number {i} with a few words in it\n" for i in range(2000)))
    out = tmp_path / "out.npy"
    mark = tmp_path / "mark"
    e = env(tmp_path, QKV_FAULT_PAUSE="cli.start:0", QKV_FAULT_MARK=str(mark))  # marks that qkv's code runs
    proc = subprocess.Popen([sys.executable, "-m", "qkv", "embed", str(model_folder), str(text), "--out", str(out),
                             "--no-progress"], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not mark.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = [x for x in err.splitlines() if x.strip()]
    if proc.returncode == 0:
        assert out.is_file() and len(__import__("numpy").load(out)) == 2000
    else:
        assert proc.returncode == 130 and "Traceback" not in err and len(lines) == 1 and "interrupted" in lines[0], err
        assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.npy")]  # no temporary file left


def test_workers_of_a_harness_killed_with_sigkill_stop_too(tmp_path):
    """``qkv ablate --jobs N`` starts its workers with :func:`qkv.training.stop.end_with_parent`: a harness
    ended by ``kill -9`` (which it cannot catch) takes them with it (SIGTERM: each stops as for a stop
    request) instead of leaving them training into its folder."""
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from qkv.training.stop import end_with_parent\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], preexec_fn=end_with_parent)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(120)\n")], env=env(tmp_path))
    deadline = time.time() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.time() < deadline and parent.poll() is None, "the harness never started its worker"
        time.sleep(0.01)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 20
    while Path(f"/proc/{child}").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2], \
        "the worker outlived its harness"
