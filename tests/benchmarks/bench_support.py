"""Helpers of the benchmark scripts' tests: a script of ``benchmarks/`` loaded as a module, in process, and
the flags its ``--help`` does not list."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` executed afresh as the module ``qkv_bench_<name>`` (registered in
    ``sys.modules``: a script's dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(f"qkv_bench_{name}", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def missing_flags(script: ModuleType, *flags: str) -> list[str]:
    """The ``flags`` that ``script``'s ``--help`` (its ``build_parser()``) does not list."""
    text = script.build_parser().format_help()
    return [flag for flag in flags if flag not in text]
