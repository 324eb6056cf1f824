"""docs/architecture.md's worked examples run as written: a new similarity, a new attention backend and
a new training objective, each one file plus its test, with no edit to qkv's code — written to an empty
folder as those files and run by pytest there, imported the way a user would (in fresh interpreters, so
that what they register does not leak into other tests)."""

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


def _run_as_files(tmp_path: Path, names: list[str], blocks: dict[str, str], passed: int) -> None:
    """Write ``names`` to an empty folder as the page shows them and run pytest there."""
    for name in names:
        (tmp_path / name).write_text(blocks[name], encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    tests = [n for n in names if n.startswith("test_")]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"{passed} passed" in done.stdout


def test_a_similarity_and_a_backend_are_each_a_user_s_two_files(tmp_path):
    blocks = _blocks()
    names = ["my_similarity.py", "test_my_similarity.py", "math_sdpa.py", "test_math_sdpa.py"]
    assert list(blocks)[:4] == names, list(blocks)
    assert "import my_similarity" in blocks["test_my_similarity.py"]  # imported, not pasted
    assert "import math_sdpa" in blocks["test_math_sdpa.py"]
    for needle in ("attention.py", "attend.py"):  # the examples import, never edit, the model code
        assert all(needle not in blocks[n] for n in names)
    _run_as_files(tmp_path, names, blocks, passed=2)


def test_the_objective_example_runs_as_a_user_s_two_files(tmp_path):
    blocks = _blocks()
    names = ["my_objective.py", "test_my_objective.py"]
    assert list(blocks)[4:6] == names, list(blocks)
    assert "from my_objective import" in blocks["test_my_objective.py"]  # imported, not pasted
    assert "qkv" not in blocks["my_objective.py"] and ".backward(" not in "".join(blocks[n] for n in names)
    _run_as_files(tmp_path, names, blocks, passed=2)
