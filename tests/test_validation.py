"""qkv.validation: the shared config checks, their one-line messages, and what each lets pass."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import pytest

from qkv.errors import QkvError
from qkv.validation import (check_bool, check_choice, check_field_types, check_int, check_positive,
                            check_range, is_int, is_number)


def _message(check, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        check(*args, **kwargs)
    text = str(info.value)
    assert "\n" not in text
    return text


def test_int_and_number_predicates_refuse_bools():
    assert is_int(3) and not is_int(True) and not is_int(3.0)
    assert is_number(3) and is_number(0.5) and not is_number(False) and not is_number("1")


@pytest.mark.parametrize("value", [0, -1, 2.0, "3", True, None])
def test_check_int(value):
    assert _message(check_int, "steps", value) == f"steps={value!r} must be an int ≥ 1"


def test_check_int_options():
    check_int("pad", 0, low=0)
    check_int("chunk", None, optional=True)
    check_int("threads", True, allow_bool=True)
    assert (_message(check_int, "threads", 0, optional=True, tail=" or None")
            == "threads=0 must be an int ≥ 1 or None")
    assert _message(check_int, "k", 1, low=2, where="g.json: ") == "g.json: k=1 must be an int ≥ 2"
    with pytest.raises(QkvError, match="must be an int"):
        check_int("steps", 0, error=QkvError)


def test_check_choice():
    check_choice("norm", "pre", ("post", "pre"))
    check_choice("to", None, ("qkv", "hf"), optional=True)
    assert (_message(check_choice, "norm", "mid", ("post", "pre"))
            == "norm='mid' is not allowed; allowed: post, pre")
    assert _message(check_choice, "to", None, ["qkv", "hf"]) == "to=None is not allowed; allowed: qkv, hf"


def test_check_bool():
    check_bool("pooler", False)
    assert _message(check_bool, "pooler", 1) == "pooler=1 must be True or False"


def test_check_positive():
    check_positive("eps", 1e-12)
    check_positive("base", math.inf)
    check_positive("budget", None, optional=True)
    for bad in (0, -2.5, math.nan, True, "1"):
        assert _message(check_positive, "eps", bad) == f"eps={bad!r} must be a positive number"
    assert (_message(check_positive, "time_budget", 0, unit=" of minutes", where="x: ")
            == "x: time_budget=0 must be a positive number of minutes")


@pytest.mark.parametrize("bounds,inside,outside,shown", [
    ("[)", [0, 0.5], [1, -0.1], "[0, 1)"),
    ("()", [0.5], [0, 1], "(0, 1)"),
    ("(]", [1, 0.2], [0, 1.5], "(0, 1]"),
    ("[]", [0, 1], [1.01], "[0, 1]"),
])
def test_check_range_intervals(bounds, inside, outside, shown):
    for v in inside:
        check_range("p", v, 0, 1, bounds=bounds)
    for v in outside:
        assert _message(check_range, "p", v, 0, 1, bounds=bounds) == f"p={v!r} must be in {shown}"


def test_check_range_lower_bound_only():
    check_range("wd", 0, 0)
    check_range("k", 3, 1)
    assert _message(check_range, "wd", -1, 0) == "wd=-1 must be ≥ 0"
    assert _message(check_range, "lr", 0, 0, bounds="(") == "lr=0 must be > 0"
    assert _message(check_range, "lr", math.nan, 0, bounds="(") == "lr=nan must be > 0"


def test_check_range_number_noun_tail_and_optional():
    check_range("dropout", None, 0, 1, optional=True)
    for bad in (1.0, "0.1", True, -0.5):
        assert (_message(check_range, "dropout", bad, 0, 1, number=True)
                == f"dropout={bad!r} must be a number in [0, 1)")
    check_range("dropout", False, 0, 1)  # compared only: False is 0
    assert (_message(check_range, "warmup", 1, 0, 1, noun="a fraction")
            == "warmup=1 must be a fraction in [0, 1)")
    assert (_message(check_range, "rate", 0, 0, 1, bounds="(]", tail=": the share of tokens")
            == "rate=0 must be in (0, 1]: the share of tokens")
    with pytest.raises(TypeError):  # without number=True the value is only compared
        check_range("p", "x", 0, 1)


@dataclass
class _Config:
    n: int = 1
    x: float = 0.5
    flag: bool = True
    name: str = "a"
    specs: tuple[str, ...] = ("a",)
    more: dict[str, Any] | None = None
    size: int | None = None
    anything: object = None


@pytest.mark.parametrize("field,value,message", [
    ("n", "3", "n='3' must be an integer"),
    ("n", True, "n=True must be an integer"),
    ("x", "fast", "x='fast' must be a number"),
    ("x", math.inf, "x=inf must be a finite number"),
    ("flag", 1, "flag=1 must be true or false"),
    ("name", 3, "name=3 must be a string"),
    ("specs", ("a", 1), "specs=('a', 1) must be a string or a list of strings"),
    ("more", [], "more=[] must be a JSON object or null"),
    ("size", 2.5, "size=2.5 must be an integer or null"),
])
def test_check_field_types(field, value, message):
    check_field_types(_Config(x=2, specs=["a", "b"], size=None, anything=object()))
    with pytest.raises(ValueError, match=re.escape(message) + "$"):
        check_field_types(_Config(**{field: value}))


def test_upper_limits_name_the_value_and_the_limit():
    from qkv.validation import MAX_BATCH_TOKENS, check_at_most, check_batch_tokens, check_cpus, usable_cpus

    check_at_most("steps", 10, 10)
    check_at_most("steps", None, 10)
    assert _message(check_at_most, "steps", 10**12, 10_000_000, why="the most steps") == \
        "steps=1,000,000,000,000 is above 10,000,000 (the most steps); give a smaller value"
    assert _message(check_at_most, "time_budget", 1e30, 43_200) == "time_budget=1e+30 is above 43,200; give a smaller value"
    check_batch_tokens("batch_size", MAX_BATCH_TOKENS // 8, 8)
    assert _message(check_batch_tokens, "batch_size", 10**9, 19).startswith(
        "batch_size=1,000,000,000 × max_len=19 = 19,000,000,000 tokens in one batch is above 4,194,304; "
        "give a smaller batch_size or max_len")
    with pytest.raises(QkvError, match="batch_size=5,000,000 in one batch"):
        check_batch_tokens("batch_size", 5_000_000, None, error=QkvError)
    check_cpus("--threads", usable_cpus())
    check_cpus("--threads", "adaptive")
    assert _message(check_cpus, "--jobs", usable_cpus() + 1).startswith(f"--jobs {usable_cpus() + 1:,} is more than the")
