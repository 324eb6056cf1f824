"""The docs cannot drift: every fenced shell and Python block of README.md and docs/ either runs
(as written, or with the cut-down substitutions its marker shows in the page's source) or carries a
visible marker saying why it is not run (tests/docs_blocks.py describes the markers).

Every page is in ``RUN`` or, with its reason, in ``EXCLUDED`` (tests/docs_blocks.py); a new page in
neither fails :func:`test_every_page_is_run_or_excluded_with_a_reason`. The pages in ``RUN`` are run
block by block in a fresh folder holding small fixtures (a tiny encoder ``tiny-model``, a tiny
fine-tuned classifier ``tiny-classifier``, a tiny causal LM ``tiny-lm``, ``docs.txt`` (also gzipped)
and ``notes/`` of real prose, ``docs.jsonl`` / ``data.jsonl`` with a ``topic`` label, the labelled sets
of the fine-tuning page, ``model.onnx``, and for the vision and translation pages ``pictures/`` (two
classes of 28 × 28 grey pictures), ``shoe.png``, ``shirt.jpg``, ``canvas1.png``, ``canvas2.png``
(56 × 56) and ``verses.txt``). A block that needs a Debian or PyPI package (its ``needs`` marker) is
skipped, naming the package, where it is missing; its page's other blocks still run.

``pytest -s tests/test_docs_blocks.py -k inventory`` prints the counts (with ``QKV_DOCS_SUMMARY=1``,
every block of every page and its status); ``python tests/docs_blocks.py --summary`` prints the
same list without pytest."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from docs_blocks import (RUN, ROOT, Block, all_blocks, blocks_of, exclusion, pages, parse_file_marker, parse_marker,
                         parse_needs, shell_commands, summary)
from qkv.data.errors import CorpusNotFoundError
from qkv.data.image_datasets import FASHION_MNIST_DIR
from qkv.data.sword import find_module
from qkv.translation.apertium import apertium_missing

#: wall seconds a block may run (``QKV_DOCS_BLOCK_TIMEOUT_S`` raises it on a machine busy with other work)
BLOCK_TIMEOUT_S = int(os.environ.get("QKV_DOCS_BLOCK_TIMEOUT_S", "600"))



def _sword(module: str):
    return lambda: _found(lambda: find_module(module))


def _found(look) -> bool:
    try:
        look()
    except CorpusNotFoundError:
        return False
    return True


#: how the test looks for each package a ``needs`` marker may name (Debian and PyPI names)
NEED_CHECKS = {
    "sword-text-kjv": _sword("engKJV2006eb"),
    "sword-text-sparv": _sword("spaRV1909eb"),
    "apertium-eng-spa": lambda: apertium_missing("en", "es") is None,
    "dataset-fashion-mnist": lambda: (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
    "mnist1d": lambda: importlib.util.find_spec("mnist1d") is not None,
}


def missing_needs(block: Block) -> list[str]:
    """The packages ``block`` needs that are not installed here."""
    return [name for name in block.needs if not NEED_CHECKS[name]()]


def test_every_page_is_run_or_excluded_with_a_reason():
    names = [str(p.relative_to(ROOT)) for p in pages()]
    left = [n for n in names if n not in RUN and not exclusion(n)]
    assert not left, f"docs pages neither in RUN nor in EXCLUDED (tests/docs_blocks.py): {left}"
    assert not [n for n in names if n in RUN and exclusion(n)], "a page is both run and excluded"
    assert not [n for n in RUN if n not in names], "RUN names a page that does not exist"
    hidden = [b.name for n in names if exclusion(n) for b in blocks_of(ROOT / n) if b.kind]
    assert not hidden, f"an excluded page holds program blocks; run them: {hidden}"


def test_every_marker_parses_and_every_substitution_occurs():
    for block in all_blocks():
        block.source()  # raises on a substitution that does not occur
    assert parse_marker("not run — needs the network") == ("needs the network", ())
    assert parse_marker('run with "--steps 2000" → "--steps 2"; "a" → "b"') == (
        None, (("--steps 2000", "--steps 2"), ("a", "b")))
    assert parse_marker(r'run with "f(\"a\")" → "f(\"b\", 1)"') == (None, (('f("a")', 'f("b", 1)'),))
    for bad in ("not run", "run with nothing", "skip it"):
        with pytest.raises(ValueError):
            parse_marker(bad)
    assert parse_file_marker("file my-grids/ffn.json") == "my-grids/ffn.json"
    assert parse_file_marker("run with \"a\" → \"b\"") is None
    for bad in ("file /etc/x", "file ../x", "file "):
        with pytest.raises(ValueError):
            parse_file_marker(bad)
    assert all(b.kind is None for b in all_blocks() if b.file), "a file marker belongs on a data block"
    assert parse_needs("needs mnist1d, sword-text-kjv; run with \"a\" → \"b\"") == (
        ("mnist1d", "sword-text-kjv"), 'run with "a" → "b"')
    assert parse_needs("not run — x") == ((), "not run — x")
    with pytest.raises(ValueError):
        parse_needs("needs ; run with \"a\" → \"b\"")
    unknown = {(b.name, n) for b in all_blocks() for n in b.needs if n not in NEED_CHECKS}
    assert not unknown, f"needs markers naming packages the test cannot look for: {unknown}"


def test_inventory_of_blocks(capsys):
    blocks = all_blocks()
    covered = [b for b in blocks if b.page in RUN]
    run = [b for b in covered if b.kind and not b.skip]
    marked = Counter(b.skip for b in covered if b.skip)
    data = [b for b in covered if not b.kind and not b.file]
    files = [b for b in covered if b.file]
    left = Counter(b.page for b in blocks if b.page not in RUN and not exclusion(b.page))
    needs = Counter(n for b in run for n in b.needs)
    with capsys.disabled():
        if os.environ.get("QKV_DOCS_SUMMARY") == "1":
            print("\n" + summary())
        print(f"\ndocs blocks: {len(blocks)} in {len({b.page for b in blocks})} pages; in the {len(RUN)} pages run "
              f"here: {len(run)} run, {sum(marked.values())} marked not run, {len(files)} data blocks written as files "
              f"for the blocks after them, {len(data)} data/synopsis blocks")
        for reason, n in marked.items():
            print(f"  not run ({n}): {reason}")
        for name, n in sorted(needs.items()):
            print(f"  needing {name} ({n} of those run; skipped where it is missing): "
                  f"{'installed' if NEED_CHECKS[name]() else 'MISSING here'}")
        print(f"  pages excluded: {len([p for p in pages() if exclusion(str(p.relative_to(ROOT)))])} "
              f"(reports qkv wrote, no commands); pages not covered: {len(left)}")
    assert run and all(b.page in RUN for b in run) and not left


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, pydoc_texts) -> Path:
    return build_workdir(tmp_path_factory.mktemp("docs-work"), pydoc_texts)


def build_workdir(work: Path, pydoc_texts: list[str]) -> Path:
    """The fixtures the pages' blocks run on, written into ``work``."""
    from qkv.checkpoints.io import load, save
    from qkv.checkpoints.onnx import export_onnx
    from qkv.config import ModelConfig
    from qkv.data.tokenizer import train_tokenizer
    from qkv.models.builders import build_causal_lm, build_encoder
    from qkv.models.heads import TaskConfig
    from qkv.models.task_builders import attach_task_head

    # four layers and a 512-row position table: the pages' `--layers -4 -3 -2 -1` and `--max-len 256` run as written
    tok = train_tokenizer(pydoc_texts, vocab_size=400, max_chars=200_000)
    torch.manual_seed(0)
    encoder = build_encoder(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_len=512, n_layers=4))
    save(encoder, work / "tiny-model", tokenizer=tok.backend)
    model, tok = load(work / "tiny-model")
    save(attach_task_head(model, TaskConfig(task="sequence-classification", labels=("neg", "pos"))),
         work / "tiny-classifier", tokenizer=tok)
    torch.manual_seed(0)
    lm = build_causal_lm(ModelConfig.preset("gpt2", vocab_size=tok.get_vocab_size(), d_model=24, n_heads=3,
                                            d_ff=40, n_layers=2, max_len=64))
    save(lm, work / "tiny-lm", tokenizer=tok)
    text = "\n".join(t.replace("\n", " ") for t in pydoc_texts[:50])
    (work / "docs.txt").write_text(text + "\n")
    (work / "notes").mkdir()  # other documents: a held-out corpus is never the training one
    (work / "notes" / "a.txt").write_text("\n".join(t.replace("\n", " ") for t in pydoc_texts[50:]) + "\n")
    labelled = [{"id": i, "text": t.replace("\n", " ")[:400], "topic": ("syntax", "library")[i % 2]}
                for i, t in enumerate(pydoc_texts[:40])]
    (work / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in labelled))
    (work / "data.jsonl").write_text((work / "docs.jsonl").read_text())
    (work / "docs.txt.gz").write_bytes(gzip.compress((work / "docs.txt").read_bytes()))
    _labelled_files(work, pydoc_texts)
    _pictures(work)
    (work / "verses.txt").write_text("In the beginning God created the heaven and the earth.\n"
                                     "And the earth was without form, and void.\n"
                                     "And God saw the light, that it was good.\n")
    export_onnx(work / "tiny-model", work / "model.onnx", check=False)
    return work


def _labelled_files(work: Path, pydoc_texts: list[str]) -> None:
    """Small labelled sets in the formats the fine-tuning page uses (CSV, CoNLL, JSONL), cut from real prose."""
    sentences = [s.strip() for t in pydoc_texts[:40] for s in t.replace("\n", " ").split(". ")
                 if 30 < len(s.strip()) < 200 and "," not in s and '"' not in s][:80]
    assert len(sentences) >= 40
    rows = ["text,label"] + [f"{s},{('neg', 'pos')[len(s.split()) % 2]}" for s in sentences]
    (work / "reviews.csv").write_text("\n".join(rows[:61]) + "\n")
    (work / "reviews-test.csv").write_text("\n".join(rows[:1] + rows[61:]) + "\n")
    keywords = {"if", "for", "while", "return", "def", "class", "import", "in", "is", "not", "and", "or", "with"}
    conll = ["\n".join(f"{w} {'B-KW' if w in keywords else 'O'}" for w in s.split()[:16]) for s in sentences]
    (work / "ner-train.conll").write_text("\n\n".join(conll[:60]) + "\n")
    (work / "ner-dev.conll").write_text("\n\n".join(conll[60:]) + "\n")
    (work / "scores.jsonl").write_text("".join(json.dumps({"text": s, "label": float(len(s.split()))}) + "\n"
                                               for s in sentences))


def _pictures(work: Path) -> None:
    """Grey pictures for the vision page: ``pictures/`` (two classes of forty 28 × 28 pictures: stripes
    across or down), ``shoe.png`` and ``shirt.jpg`` (28 × 28), ``canvas1.png`` and ``canvas2.png`` (56 × 56)."""
    rng = np.random.default_rng(0)

    def picture(size: int, across: bool) -> Image.Image:
        stripes = np.zeros((size, size), dtype=np.uint8)
        stripes[::4] = 200
        noise = rng.integers(0, 40, (size, size), dtype=np.uint8)
        return Image.fromarray((stripes if across else stripes.T) + noise, mode="L")

    for name, across in (("across", True), ("down", False)):
        (work / "pictures" / name).mkdir(parents=True)
        for i in range(40):  # more than one batch of the vit-digits recipe (64) after its held-out share
            picture(28, across).save(work / "pictures" / name / f"{i}.png")
    picture(28, True).save(work / "shoe.png")
    picture(28, False).save(work / "shirt.jpg", quality=95)
    picture(56, True).save(work / "canvas1.png")
    picture(56, False).save(work / "canvas2.png")


def _children_cpu_s() -> float:
    """User + system CPU seconds of every finished child process (and the children they waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(block: Block, work: Path) -> tuple[float, float]:
    """Run ``block`` in ``work``; ``(wall seconds, CPU seconds)`` it took (fails the test if it fails)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), str(work)]),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    source = block.source()
    module = re.match(r"# (\w+)\.py\b", source)
    if block.kind == "python" and module:  # a file the page shows (a plugin module): written, then imported
        (work / f"{module[1]}.py").write_text(source, encoding="utf-8")
        argv = [sys.executable, "-c", f"import {module[1]}"]
    elif block.kind == "python":
        argv = [sys.executable, "-c", source]
    else:  # each command in turn; `qkv` and `python` are this interpreter's
        prelude = (f'qkv() {{ "{sys.executable}" -m qkv "$@"; }}\npython() {{ "{sys.executable}" "$@"; }}\n'
                   f'torchrun() {{ "{sys.executable}" -m torch.distributed.run "$@"; }}\nset -e\n')
        argv = ["bash", "-c", prelude + "\n".join(shell_commands(source))]
    # its own process group: a block that runs too long is stopped with every process it started
    wall, cpu = time.perf_counter(), _children_cpu_s()
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{block.name} ran past {BLOCK_TIMEOUT_S} s:\n{source}\n{out[-2000:]}\n{err[-3000:]}")
    assert proc.returncode == 0, f"{block.name} failed:\n{source}\n{out[-2000:]}\n{err[-3000:]}"
    return time.perf_counter() - wall, _children_cpu_s() - cpu


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN)
def test_the_blocks_of_a_page_run(page, workdir, tmp_path, capsys):
    """Each block's wall and CPU seconds are printed (also when one fails), to find the slow ones."""
    work = tmp_path / "work"
    shutil.copytree(workdir, work)  # each page in its own copy: one page's runs/ never meet another's
    skipped, times = [], []
    try:
        for block in blocks_of(ROOT / page):
            if block.file:
                (work / block.file).parent.mkdir(parents=True, exist_ok=True)
                (work / block.file).write_text(block.text, encoding="utf-8")
            elif block.kind and not block.skip and missing_needs(block):
                skipped.append(f"{block.name} (needs {', '.join(missing_needs(block))}: `make data`, as root)")
            elif block.kind and not block.skip:
                times.append((block.name, *_run(block, work)))
    finally:
        with capsys.disabled():
            print("".join(f"\n  {name}: {wall:.1f} s wall, {cpu:.1f} s CPU" for name, wall, cpu in times)
                  + f"\n  {page}: {len(times)} blocks, {sum(t[1] for t in times):.1f} s wall, "
                    f"{sum(t[2] for t in times):.1f} s CPU")
    if skipped:  # every other block of the page has run
        pytest.skip(f"{len(skipped)} block(s) of {page} skipped for a missing package: {'; '.join(skipped)}")
