"""docs/architecture.md's worked examples run as written: a new similarity and a new attention
backend, each one file plus its test, with no edit to the model code.

They run in a fresh interpreter, so that what they register does not leak into other tests.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def test_worked_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    names = [b.splitlines()[0] for b in blocks]
    assert names == ["# my_similarity.py", "# test_my_similarity.py — checked against a formula transcription, "
                     "not against itself", "# math_sdpa.py — torch's math kernel, e.g. to compare against the "
                     "flash kernel", "# test_math_sdpa.py — against the explicit backend"], names
    tests = [name for b in blocks for name in re.findall(r"^def (test_\w+)", b, flags=re.M)]
    script = "\n".join(blocks) + "\n" + "\n".join(f"{t}()" for t in tests) + "\nprint('ok', len(%r))\n" % tests
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok 2"
    for needle in ("attention.py", "attend.py"):  # the examples import, never edit, the model code
        assert all(needle not in b for b in blocks)
