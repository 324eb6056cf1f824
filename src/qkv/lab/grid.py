"""Lab grids: one textbook question, one synthetic task, the variants that answer it.

A lab grid is a JSON file (the built-in ones live in ``qkv/lab/grids/``)::

    {
      "name": "lab-heads",
      "question": "Do several heads beat one head of the same total width?",
      "claim": "what the textbook says, in a sentence (goes into the report)",
      "task": "two_lookup", "task_options": {"combine": "difference"},
      "base": {"steps": 600, "model": {"n_layers": 1}},
      "variants": {"h1": {"model": {"n_heads": 1}}, "h2": {"model": {"n_heads": 2}}},
      "metric": "accuracy",
      "comparisons": [["h2", "h1"]],
      "maps": ["h2", "h1"],
      "notes": "free text"
    }

* ``base`` and each variant hold :class:`~qkv.lab.encoder_config.EncoderTaskConfig` fields (``steps``,
  ``lr``, ``warmup_steps``, ``eval_lengths``, …) and ``model``: ModelConfig overrides, merged key by
  key over the base's. ``task``, ``task_options`` and ``seed`` belong to the grid and the harness:
  every variant sees the same rows.
* A variant's ``lr`` may be a list: a learning-rate sweep. Each rate is its own cell
  (``name@lr=0.001``); the variant's value is the best rate's (by mean over seeds).
* ``metric`` is what the verdict is about: ``accuracy`` / ``sequence_accuracy`` (held-out exact
  match at the training distribution) or ``accuracy@N`` / ``sequence_accuracy@N`` (at evaluation
  length N, which must be among ``base.eval_lengths``).
* ``comparisons``: pairs of variant names the report tests (paired over seeds, Holm-corrected);
  ``maps``: two variants whose attention on one held-out row is drawn side by side (default: the
  best and the worst by the metric).

Every problem raises ``ValueError`` naming the file, the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from qkv.lab.synthetic import SYNTHETIC_TASKS
from qkv.lab.encoder_config import EncoderTaskConfig

__all__ = ["LabGrid", "Cell", "load_lab_grid", "builtin_lab_grids", "is_lab_grid", "parse_metric",
           "DECISION_GAP"]

#: The gap (accuracy points) every seed must show for a comparison to count as decided.
DECISION_GAP = 0.10
_TOP_KEYS = ("name", "question", "claim", "task", "task_options", "base", "variants", "metric",
             "comparisons", "maps", "notes")
_RUN_FIELDS = ("task_options", "model", "steps", "batch_size", "lr", "warmup_steps", "schedule", "weight_decay",
               "clip_norm", "eval_lengths", "eval_batches", "eval_batch_size", "log_every")
_GRID_OWNED = ("task", "task_options", "seed")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_METRIC = re.compile(r"^(accuracy|sequence_accuracy)(?:@([1-9][0-9]*))?$")


def parse_metric(metric: str) -> tuple[str, int | None]:
    """``"accuracy@64"`` → ``("accuracy", 64)``; ``"accuracy"`` → ``("accuracy", None)``."""
    m = _METRIC.match(metric) if isinstance(metric, str) else None
    if m is None:
        raise ValueError(f"metric={metric!r} must be accuracy, sequence_accuracy, accuracy@N or "
                         "sequence_accuracy@N (N an evaluation length)")
    return m.group(1), (int(m.group(2)) if m.group(2) else None)


@dataclass(frozen=True)
class Cell:
    """One trained configuration of a grid (a variant, or one rate of a variant's sweep).

    Attributes:
        name: folder-safe label (``variant`` or ``variant@lr=R``). variant: the variant it belongs to.
        overrides: the EncoderTaskConfig fields of this cell (base merged with the variant's).
    """

    name: str
    variant: str
    overrides: dict[str, Any]


@dataclass(frozen=True)
class LabGrid:
    """A lab grid (see the module docstring). ``source`` says where it was read from."""

    name: str
    question: str
    task: str
    variants: dict[str, dict[str, Any]]
    metric: str = "accuracy"
    claim: str = ""
    task_options: dict[str, Any] = field(default_factory=dict)
    base: dict[str, Any] = field(default_factory=dict)
    comparisons: tuple[tuple[str, str], ...] = ()
    maps: tuple[str, str] | None = None
    notes: str = ""
    source: str = ""

    def cells(self, overrides: dict[str, Any] | None = None) -> list[Cell]:
        """Every cell, in the grid's order; ``overrides`` (from ``--set`` / ``--steps``) go over all."""
        out = []
        for vname, over in self.variants.items():
            merged = _merge(_merge(self.base, over), overrides or {})
            merged["task_options"] = dict(self.task_options)
            rates = merged.get("lr")
            if isinstance(rates, list) and not (overrides or {}).get("lr"):
                for lr in rates:
                    out.append(Cell(f"{vname}@lr={lr:g}", vname, {**merged, "lr": lr}))
            else:
                out.append(Cell(vname, vname, merged))
        return out

    def subset(self, names: Sequence[str]) -> LabGrid:
        """The grid with only the variants ``names``; comparisons and maps among them are kept."""
        names = list(names)
        unknown = [n for n in names if n not in self.variants]
        if unknown or not names or len(set(names)) != len(names):
            raise ValueError(f"--variants: {', '.join(map(repr, unknown)) or repr(names)} — give each of grid "
                             f"{self.name!r}'s variants at most once ({', '.join(self.variants)})")
        keep = set(names)
        maps = self.maps if self.maps and set(self.maps) <= keep else None
        return dataclasses.replace(self, variants={k: v for k, v in self.variants.items() if k in keep},
                                   comparisons=tuple(p for p in self.comparisons if set(p) <= keep), maps=maps)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("source")
        out["comparisons"] = [list(p) for p in self.comparisons]
        out["maps"] = list(self.maps) if self.maps else None
        return out

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<dict>") -> LabGrid:
        """Validate and build; every error names ``source``."""
        where = source
        if not isinstance(data, dict):
            raise ValueError(f"{where}: a lab grid must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_TOP_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(_TOP_KEYS)}")
        for key in ("name", "question", "task", "variants"):
            if key not in data:
                raise ValueError(f"{where}: missing key {key!r} (required: name, question, task, variants)")
        name = data["name"]
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{where}: name={name!r} must be letters, digits, '.', '_', '+', '-'")
        for key in ("question", "claim", "notes"):
            if not isinstance(data.get(key, ""), str):
                raise ValueError(f"{where}: {key} must be a string")
        if not data["question"].strip():
            raise ValueError(f"{where}: question must be a non-empty string")
        task = data["task"]
        if task not in SYNTHETIC_TASKS:
            raise ValueError(f"{where}: task={task!r}; allowed: {', '.join(SYNTHETIC_TASKS)}")
        options = data.get("task_options", {})
        if not isinstance(options, dict):
            raise ValueError(f"{where}: task_options must be an object of the task's options")
        base = data.get("base", {})
        _check_overrides(f"{where}: base", base)
        variants = data["variants"]
        if not isinstance(variants, dict) or not variants:
            raise ValueError(f"{where}: variants must be a non-empty object of name → overrides")
        for vname, over in variants.items():
            if not _NAME.match(vname) or "@" in vname:
                raise ValueError(f"{where}: variant name {vname!r} must be letters, digits, '.', '_', '+', '-'")
            _check_overrides(f"{where}: variant {vname!r}", over)
        metric = data.get("metric", "accuracy")
        try:
            _, length = parse_metric(metric)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if length is not None:
            for vname, over in variants.items():
                lengths = _merge(base, over).get("eval_lengths", [])
                if length not in lengths:
                    raise ValueError(f"{where}: metric {metric!r} needs {length} in eval_lengths "
                                     f"(variant {vname!r} has {lengths})")
        comparisons = data.get("comparisons", [])
        if not isinstance(comparisons, list):
            raise ValueError(f"{where}: comparisons must be a list of [variant, variant] pairs")
        for pair in comparisons:
            _check_pair(where, "comparisons", pair, variants)
        maps = data.get("maps")
        if maps is not None:
            _check_pair(where, "maps", maps, variants)
        grid = cls(name, data["question"].strip(), task, _copy(variants), metric, data.get("claim", "").strip(),
                   _copy(options), _copy(base), tuple(tuple(p) for p in comparisons),
                   tuple(maps) if maps else None, data.get("notes", ""), source)
        for cell in grid.cells():  # every cell builds (bad task options, model fields, values)
            try:
                EncoderTaskConfig(**run_fields(grid, cell.overrides), seed=0)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{where}: cell {cell.name!r}: {e}") from None
        return grid


def run_fields(grid: LabGrid, overrides: dict[str, Any]) -> dict[str, Any]:
    """The EncoderTaskConfig keyword arguments of a cell (``eval_lengths`` as a tuple)."""
    out = {"task": grid.task, **overrides}
    if "eval_lengths" in out:
        out["eval_lengths"] = tuple(out["eval_lengths"])
    return out


def _check_pair(where: str, key: str, pair: Any, variants: dict) -> None:
    if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
            and pair[0] != pair[1]):
        raise ValueError(f"{where}: {key}: {pair!r} must be two different variant names")
    missing = [p for p in pair if p not in variants]
    if missing:
        raise ValueError(f"{where}: {key}: no variant {missing[0]!r}; variants: {', '.join(variants)}")


def _check_overrides(where: str, over: Any) -> None:
    if not isinstance(over, dict):
        raise ValueError(f"{where}: overrides must be an object of run fields and 'model', got {over!r}")
    for key, value in over.items():
        if key in _GRID_OWNED:
            raise ValueError(f"{where}: {key!r} belongs to the grid (top-level task/task_options) or the "
                             "harness (--seeds); every variant shares it")
        if key not in _RUN_FIELDS:
            raise ValueError(f"{where}: unknown key {key!r}; allowed: {', '.join(_RUN_FIELDS)}")
        if key == "model" and not isinstance(value, dict):
            raise ValueError(f"{where}: model must be an object of ModelConfig fields, got {value!r}")
        if key == "lr" and isinstance(value, list) and (not value or len(set(value)) != len(value)):
            raise ValueError(f"{where}: lr sweep {value!r} must list distinct rates")


def _merge(a: dict, b: dict) -> dict:
    out = _copy(a)
    for key, value in b.items():
        out[key] = {**out.get(key, {}), **value} if key == "model" else _copy(value)
    return out


def _copy(obj):
    return json.loads(json.dumps(obj))


def _grids_dir():
    return resources.files("qkv.lab") / "grids"


def builtin_lab_grids() -> dict[str, str]:
    """Built-in lab grid name → its question (in file-name order)."""
    out = {}
    for entry in sorted(_grids_dir().iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".json"):
            grid = LabGrid.from_dict(json.loads(entry.read_text(encoding="utf-8")), source=entry.name)
            out[grid.name] = grid.question
    return out


def is_lab_grid(name_or_path: str) -> bool:
    """Whether ``name_or_path`` names a built-in lab grid or a JSON file with a top-level ``task``."""
    path = Path(str(name_or_path)).expanduser()
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return False  # the text-grid loader names the problem
        return isinstance(data, dict) and "task" in data
    return (_grids_dir() / f"{name_or_path}.json").is_file()


def load_lab_grid(name_or_path: str | Path) -> LabGrid:
    """A built-in lab grid by name, or a lab grid file by path (``ValueError`` naming the problem)."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_file():
        source, raw = str(path), path.read_text(encoding="utf-8")
    else:
        entry = _grids_dir() / f"{text}.json"
        if not entry.is_file():
            raise ValueError(f"unknown lab grid {text!r}; built-in: {', '.join(builtin_lab_grids())}")
        source, raw = f"built-in grid {text}", entry.read_text(encoding="utf-8")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from e
    return LabGrid.from_dict(data, source=source)
