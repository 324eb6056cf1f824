"""The import graph of src/qkv: no cycle between modules (imports at any depth count, an import inside a
function too), one import path per public name (no package re-exports another module's names), imports
at the top of a module unless the line says why (a comment), or the module is a command module."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC / "qkv"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path):
    """``(imported qkv module, inside a function, line)`` of every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        inner, up = False, node
        while up in parents:
            up = parents[up]
            if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = True
                break
        for name in names:
            target = _resolve(name) if name.startswith("qkv") else None
            if target and target != module:
                yield target, inner, node.lineno


def _graph() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in _imports(m, p)} for m, p in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_there_is_no_import_cycle_between_modules():
    graph = _graph()
    assert sum(len(t) for t in graph.values()) > 500  # the graph was read
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_packages_re_export_nothing():
    """A package's ``__init__`` defines its own names (the registries of backends and families, the
    inference entry points, the lazy top-level ``qkv`` names) or holds only a docstring."""
    for module, path in MODULES.items():
        if path.name != "__init__.py" or module == "qkv":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(module + "."):
                names = [a.name for a in node.names]
                exported = set()
                for n in tree.body:
                    if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets):
                        exported = set(ast.literal_eval(n.value))
                assert not (set(names) & exported), f"{module} re-exports {sorted(set(names) & exported)}"


def test_imports_are_at_the_top_unless_the_reason_is_written():
    """An import inside a function is a command module's (its library, imported when the command runs)
    or carries a comment on its line or the line before saying why (a measured import time, an
    optional dependency)."""
    unexplained = []
    for module, path in MODULES.items():
        if path.name == "cli.py" or module == "qkv":
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for _target, inner, line in _imports(module, path):
            if inner:
                unexplained.append(f"{module}:{line}")
        tree = ast.parse("\n".join(lines))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            found = [n for n in ast.walk(func) if isinstance(n, (ast.Import, ast.ImportFrom))]
            said = any("#" in lines[n.lineno - 1] or lines[n.lineno - 2].strip().startswith("#") for n in found)
            if found and not said:  # one reason, written once, covers the function's imports
                unexplained += [f"{module}:{n.lineno}: {lines[n.lineno - 1].strip()}" for n in found]
    assert unexplained == []
