"""What the hook points cost when no hook is attached: a model with them against the same model without.

"Without" is the same code with the hook check removed: the ``forward`` of ``MultiHeadAttention`` and
of ``TransformerLayer`` recompiled from their source minus the ``if TAPPED and id(self) in TAPPED``
statement (and the line it guards), bound to subclasses, and swapped into a copy of the model. The
two models give bit-identical outputs (checked); they are timed in the same process, interleaved,
after warm-up, and the medians and their ratio printed (1.00 = no cost).

    PYTHONPATH=src python benchmarks/hooks.py            # tiny (Python-bound) and MiniLM-sized encoders
    PYTHONPATH=src python benchmarks/hooks.py --quick    # a few repetitions, for a smoke test
"""

from __future__ import annotations

import argparse
import copy
import inspect
import statistics
import sys
import textwrap
import time
import timeit

import torch

from qkv.config import ModelConfig
from qkv.models.builders import build_encoder
from qkv.nn.attention import MultiHeadAttention
from qkv.nn.hooks import TAPPED
from qkv.nn.layer import TransformerLayer

#: name → (model overrides of the preset, preset, batch, length)
CASES = {
    "tiny 2×24, 2×16 tokens": ("tiny", {"max_len": 32}, 2, 16),
    "MiniLM-sized 6×384, 8×128 tokens": ("small", {"d_model": 384, "n_heads": 12, "d_ff": 1536}, 8, 128),
}
CHECK = "if TAPPED and id(self) in TAPPED"


def without_hook_check(cls: type) -> type:
    """A subclass of ``cls`` whose ``forward`` is ``cls.forward``'s source without the hook check."""
    lines, kept, guard = textwrap.dedent(inspect.getsource(cls.forward)).splitlines(), [], None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if CHECK in line:
            guard = indent
            continue
        if guard is not None and line.strip() and indent > guard:
            continue  # the statement the check guards
        guard = None
        kept.append(line)
    if len(kept) == len(lines):
        raise RuntimeError(f"{cls.__name__}.forward has no hook check to remove")
    namespace = dict(vars(sys.modules[cls.__module__]))
    exec(compile("\n".join(kept), f"<{cls.__name__}.forward without the hook check>", "exec"), namespace)
    return type(f"{cls.__name__}WithoutHookCheck", (cls,), {"forward": namespace["forward"]})


def stripped(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose attention modules and layers have no hook check."""
    swap = {MultiHeadAttention: without_hook_check(MultiHeadAttention),
            TransformerLayer: without_hook_check(TransformerLayer)}
    clone = copy.deepcopy(model)
    for m in clone.modules():
        if type(m) in swap:
            m.__class__ = swap[type(m)]
    return clone


def _time(model, ids) -> float:
    t0 = time.perf_counter()
    model(ids)
    return time.perf_counter() - t0


@torch.no_grad()
def compare(preset: str, overrides: dict, batch: int, length: int, reps: int) -> dict:
    torch.manual_seed(0)
    cfg = ModelConfig.preset(preset, dropout=0.0, vocab_size=1000, **overrides)
    hooked = build_encoder(cfg).eval()
    plain = stripped(hooked)
    ids = torch.randint(1, 1000, (batch, length))
    a, b = hooked(ids).last_hidden_state, plain(ids).last_hidden_state
    if not torch.equal(a, b):
        raise RuntimeError("the model without the hook check gives other numbers")
    for _ in range(3):
        _time(hooked, ids), _time(plain, ids)
    with_, without = [], []
    for i in range(reps):  # interleaved, the order alternating
        pair = (hooked, plain) if i % 2 == 0 else (plain, hooked)
        times = [_time(m, ids) for m in pair]
        with_.append(times[0] if i % 2 == 0 else times[1])
        without.append(times[1] if i % 2 == 0 else times[0])
    w, wo = statistics.median(with_), statistics.median(without)
    return {"with_ms": 1e3 * w, "without_ms": 1e3 * wo, "ratio": w / wo, "layers": cfg.n_layers}


def check_ns() -> float:
    """Nanoseconds of the check itself (no hook attached)."""
    m = object()
    n = 1_000_000
    return 1e9 * min(timeit.repeat(lambda: TAPPED and id(m) in TAPPED, number=n, repeat=5)) / n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=200, help="timed forward passes per model and case (default 200)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--quick", action="store_true", help="10 repetitions of the tiny case only")
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    cases = dict(list(CASES.items())[:1]) if args.quick else CASES
    reps = 10 if args.quick else args.reps
    rows = []
    print(f"hook check: {check_ns():.0f} ns per module call (two calls per layer); torch threads {args.threads}")
    print(f"{'case':36} {'with hook points':>17} {'without':>10} {'ratio':>7}")
    for name, (preset, overrides, batch, length) in cases.items():
        r = compare(preset, overrides, batch, length, reps)
        rows.append({"case": name, **r})
        print(f"{name:36} {r['with_ms']:14.3f} ms {r['without_ms']:7.3f} ms {r['ratio']:7.3f}")
    return rows


if __name__ == "__main__":
    main()
