"""docs/architecture.md's worked examples run as written: a new similarity and a new attention
backend, each one file plus its test, with no edit to the model code; and a new training objective,
one file plus its test, written to a folder as those two files and run by pytest there — imported
the way a user would.

They run in fresh interpreters, so that what they register does not leak into other tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
SRC = Path(__file__).resolve().parents[1] / "src"


def _blocks() -> dict[str, str]:
    """The python blocks of the page by their first line's file name (``# name.py — …``)."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    return {b.splitlines()[0].split()[1]: b for b in blocks}


def test_worked_examples_run():
    blocks = _blocks()
    names = ["my_similarity.py", "test_my_similarity.py", "math_sdpa.py", "test_math_sdpa.py"]
    assert list(blocks)[:4] == names, list(blocks)
    parts = [blocks[n] for n in names]
    tests = [name for b in parts for name in re.findall(r"^def (test_\w+)", b, flags=re.M)]
    script = "\n".join(parts) + "\n" + "\n".join(f"{t}()" for t in tests) + "\nprint('ok', len(%r))\n" % tests
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok 2"
    for needle in ("attention.py", "attend.py"):  # the examples import, never edit, the model code
        assert all(needle not in b for b in parts)


def test_the_objective_example_runs_as_a_user_s_two_files(tmp_path):
    blocks = _blocks()
    names = ["my_objective.py", "test_my_objective.py"]
    assert list(blocks)[4:6] == names, list(blocks)
    for name in names:
        (tmp_path / name).write_text(blocks[name], encoding="utf-8")
    assert "from my_objective import" in blocks["test_my_objective.py"]  # imported, not pasted
    assert "qkv" not in blocks["my_objective.py"] and ".backward(" not in "".join(blocks[n] for n in names)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_objective.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout
