"""The checks every configuration runs in ``__post_init__``, with their messages in one place.

Each check raises ``error`` (``ValueError`` unless told; a :class:`qkv.errors.QkvError` subclass
where a package has its own) with one line that names the field, the bad value and what is
allowed, e.g.::

    steps=0 must be an int ≥ 1
    schedule='step' is not allowed; allowed: linear, cosine, constant
    dropout=1.0 must be a number in [0, 1)

``where`` (e.g. ``"grid.json: "``) is put in front of the message; ``optional=True`` lets
``None`` pass. :func:`check_field_types` checks the JSON types of every field of a dataclass from
its annotations, so that a config file with a string where a number belongs is refused with a
message, not a crash.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable
from typing import Any

__all__ = ["is_int", "is_number", "check_int", "check_choice", "check_bool", "check_positive", "check_range",
           "check_field_types", "check_heads", "check_at_most", "check_batch_tokens", "check_run_length",
           "usable_cpus", "check_cpus", "MAX_STEPS", "MAX_MINUTES", "MAX_GRAD_ACCUM", "MAX_BATCH_TOKENS",
           "MAX_SEEDS", "MAX_NEW_TOKENS", "MAX_BEAMS", "MAX_EPOCHS"]

# The upper limits: far above any real use, low enough that an absurd value (a typo, an extra
# zero, 1e30) is refused before any work starts instead of running for years or exhausting memory.
#: optimiser steps of one run (BERT was pretrained in 1,000,000)
MAX_STEPS = 10_000_000
#: minutes of one time-budgeted run (30 days)
MAX_MINUTES = 43_200
#: micro-batches of one optimiser step
MAX_GRAD_ACCUM = 100_000
#: tokens of one batch (sequences × their length); larger batches come from gradient accumulation
MAX_BATCH_TOKENS = 1 << 22
#: seeds of one ablation grid
MAX_SEEDS = 1_000
#: passes over the fine-tuning data
MAX_EPOCHS = 10_000
#: tokens one generation or translation may add
MAX_NEW_TOKENS = 100_000
#: beams of one beam search
MAX_BEAMS = 256


def is_int(value: Any) -> bool:
    """Whether ``value`` is an ``int`` (``True``/``False`` are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is an ``int`` or a ``float`` (``True``/``False`` are not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(name: str, value: Any, low: int = 1, *, optional: bool = False, allow_bool: bool = False,
              tail: str = "", where: str = "", error: type[Exception] = ValueError) -> None:
    """``name=value must be an int ≥ low``, unless ``value`` is an int ≥ ``low``.

    Args:
        allow_bool: let ``True``/``False`` pass as 1/0 (for the options that always took them).
        tail: appended to the message, e.g. ``" or None"``.
    """
    if optional and value is None:
        return
    if not (isinstance(value, int) if allow_bool else is_int(value)) or value < low:
        raise error(f"{where}{name}={value!r} must be an int ≥ {low}{tail}")


def check_choice(name: str, value: Any, allowed: Iterable[str], *, optional: bool = False,
                 error: type[Exception] = ValueError) -> None:
    """``name=value is not allowed; allowed: a, b``, unless ``value`` is one of ``allowed``."""
    allowed = tuple(allowed)
    if optional and value is None:
        return
    if value not in allowed:
        raise error(f"{name}={value!r} is not allowed; allowed: {', '.join(map(str, allowed))}")


def check_bool(name: str, value: Any, *, error: type[Exception] = ValueError) -> None:
    """``name=value must be True or False``, unless ``value`` is a bool."""
    if not isinstance(value, bool):
        raise error(f"{name}={value!r} must be True or False")


def check_positive(name: str, value: Any, *, unit: str = "", optional: bool = False, where: str = "",
                   error: type[Exception] = ValueError) -> None:
    """``name=value must be a positive number[ unit]``, unless ``value`` is a number > 0 (inf too)."""
    if optional and value is None:
        return
    if not is_number(value) or not value > 0:
        raise error(f"{where}{name}={value!r} must be a positive number{unit}")


def check_range(name: str, value: Any, low: float, high: float | None = None, *, bounds: str = "[)",
                number: bool = False, noun: str | None = None, tail: str = "", optional: bool = False,
                where: str = "", error: type[Exception] = ValueError) -> None:
    """``name=value must be in [low, high)`` (or ``≥ low`` / ``> low`` without ``high``), unless it is.

    Args:
        bounds: which ends are included: ``"[)"``, ``"(]"``, ``"()"`` or ``"[]"``; without ``high``
            only the first character counts (``"("``: ``> low``).
        number: refuse what is not a number (``True``/``False`` too) and say "a number in …";
            without it the value is only compared (for fields whose type was checked already).
        noun: the word before "in" (default "a number" with ``number``, else none), e.g. "a fraction".
        tail: appended to the message, e.g. an explanation of the field.
    """
    if optional and value is None:
        return
    if (not number or is_number(value)) and _within(value, low, high, bounds):
        return
    noun = ("a number" if number else "") if noun is None else noun
    if high is None:
        what = f"{'>' if bounds[0] == '(' else '≥'} {low}"
    else:
        what = f"in {bounds[0]}{low}, {high}{bounds[1]}"
    raise error(f"{where}{name}={value!r} must be {noun + ' ' if noun else ''}{what}{tail}")


def _within(value: Any, low: float, high: float | None, bounds: str) -> bool:
    if not (value > low if bounds[0] == "(" else value >= low):
        return False
    return high is None or (value < high if bounds[1] == ")" else value <= high)


_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str, os.PathLike),
          "tuple[str, ...]": (tuple, list, str, os.PathLike), "dict[str, Any]": (dict,)}
_WANT = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
         "tuple[str, ...]": "a string or a list of strings", "dict[str, Any]": "a JSON object"}


def check_field_types(cfg: Any) -> None:
    """Raise ``ValueError`` naming the field when a value of the dataclass ``cfg`` has the wrong JSON
    type for its annotation (``int``, ``float`` (finite), ``bool``, ``str``, ``tuple[str, ...]``,
    ``dict[str, Any]``, each optionally ``| None``); fields of other types are not checked."""
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        optional = ann.endswith(" | None")
        base = ann[: -len(" | None")] if optional else ann
        allowed = _TYPES.get(base)
        if allowed is None or (optional and v is None):
            continue
        wrong = not isinstance(v, allowed) or (isinstance(v, bool) and bool not in allowed)
        if not wrong and base == "tuple[str, ...]" and isinstance(v, (tuple, list)):
            wrong = not all(isinstance(x, (str, os.PathLike)) for x in v)
        if not wrong and base == "float" and not math.isfinite(v):
            raise ValueError(f"{f.name}={v!r} must be a finite number")
        if wrong:
            raise ValueError(f"{f.name}={v!r} must be {_WANT[base]}{' or null' if optional else ''}")


def check_heads(d_model: Any, n_heads: Any, n_kv_heads: Any = None, *, prefix: str = "") -> None:
    """``ValueError`` unless ``d_model`` and ``n_heads`` are positive ints with H dividing C, and
    ``n_kv_heads`` (``None`` = H) divides H: the one home of the heads check. ``prefix`` goes before
    the field names (``"attention."``)."""
    check_int("d_model", d_model)
    check_int(f"{prefix}n_heads", n_heads)
    if d_model % n_heads:
        divisors = [h for h in range(1, d_model + 1) if d_model % h == 0]
        raise ValueError(f"{prefix}n_heads={n_heads} does not divide d_model={d_model} (d_model is not divisible by "
                         f"n_heads); allowed: {divisors}")
    if n_kv_heads is None:
        return
    check_int(f"{prefix}n_kv_heads", n_kv_heads)
    if n_heads % n_kv_heads:
        divisors = [h for h in range(1, n_heads + 1) if n_heads % h == 0]
        raise ValueError(f"{prefix}n_kv_heads={n_kv_heads} does not divide n_heads={n_heads}; allowed: "
                         f"{divisors} (1 = multi-query attention)")


def check_at_most(name: str, value: Any, limit: float, *, why: str = "", where: str = "",
                  error: type[Exception] = ValueError) -> None:
    """``name=value is above limit[ (why)]; ...``, unless ``value`` (a number, or ``None``) is at most
    ``limit``: the one message of the upper limits above (``why`` says what the limit is for)."""
    if value is None or not is_number(value) or value <= limit:
        return
    shown = f"{value:,}" if is_int(value) else f"{value:g}"
    raise error(f"{where}{name}={shown} is above {limit:,}{f' ({why})' if why else ''}; give a smaller value")


def check_batch_tokens(name: str, batch: Any, length: Any, *, length_name: str = "max_len",
                       error: type[Exception] = ValueError) -> None:
    """``ValueError`` when ``batch`` sequences of ``length`` tokens exceed :data:`MAX_BATCH_TOKENS` (``length``
    ``None``: the batch alone is compared); ``length_name`` names the length in the message."""
    if not is_int(batch) or (length is not None and not is_int(length)):
        return
    tokens = batch * (length or 1)
    if tokens > MAX_BATCH_TOKENS:
        what = f"{name}={batch:,} × {length_name}={length:,} = {tokens:,} tokens" if length else f"{name}={batch:,}"
        smaller = f"{name} or {length_name}" if length else name
        raise error(f"{what} in one batch is above {MAX_BATCH_TOKENS:,}; give a smaller {smaller} (grad_accum "
                    "makes a larger effective batch)")


def check_run_length(cfg: Any, *, error: type[Exception] = ValueError) -> None:
    """The upper limits of a training run's ``steps``, ``time_budget`` (minutes) and ``grad_accum`` (the
    fields ``cfg`` has)."""
    check_at_most("steps", getattr(cfg, "steps", None), MAX_STEPS, why="the most steps one run may take",
                  error=error)
    check_at_most("time_budget", getattr(cfg, "time_budget", None), MAX_MINUTES,
                  why="minutes: 30 days, the longest run", error=error)
    check_at_most("grad_accum", getattr(cfg, "grad_accum", None), MAX_GRAD_ACCUM,
                  why="micro-batches in one optimiser step", error=error)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the system tells it, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_cpus(flag: str, value: Any, *, error: type[Exception] = ValueError) -> None:
    """``error`` when ``value`` (threads or processes; ``None``/``"adaptive"`` pass) is more than
    :func:`usable_cpus` — checked where a command starts (a stored configuration may come from a larger
    machine)."""
    if is_int(value) and value > usable_cpus():
        n = usable_cpus()
        raise error(f"{flag} {value:,} is more than the {n} CPU{'s' * (n != 1)} this process may use; "
                    f"give at most {n}")
