"""Ablation grids: a small JSON file format, its loader and its validation.

A grid names the variants of one experiment and what they share::

    {
      "name": "norm",
      "question": "Does LayerNorm placement change how well and how stably the model trains?",
      "base": {"preset": "mini", "model": {"dropout": 0.1}},
      "variants": {
        "post": {"model": {"norm": "post"}},
        "pre":  {"model": {"norm": "pre"}},
        "post-lr3x": {"model": {"norm": "post"}, "lr_scale": 3}
      },
      "extra_eval": {"length_factor": 2},
      "stats": ["self_attention_share", "saturation"],
      "early_steps": 20,
      "notes": "free text"
    }

* ``base`` and each variant hold :class:`~qkv.training.TrainConfig` fields (``lr``, ``max_len``,
  ``steps``, …) and ``model``: :class:`~qkv.config.ModelConfig` field overrides. A variant's
  ``model`` is merged key by key over the base's.
* A variant may also give ``lr_scale``: a factor on the learning rate it would otherwise get (so
  ``--set lr=…`` moves every variant together).
* Fields the harness sets (``corpus``, ``eval_corpus``, ``out``, ``tokenizer``, ``seed``,
  ``progress``; ``model.vocab_size``) are refused anywhere; fields that decide the data or the
  tokenizer (:data:`DATA_FIELDS`) may be set in ``base`` only, so every variant reads the same text.
* ``extra_eval.length_factor`` (int ≥ 2): also evaluate the final model on held-out blocks that
  many times longer than the training blocks.
* ``stats``: extra statistics, from :data:`STATS`; ``early_steps``: how many first steps the
  ``saturation`` statistics watch (default 20).

Built-in grids live in ``qkv/experiments/grids/*.json`` (:func:`builtin_grids`); a path to a ``.json``
file loads a user grid. Every problem raises ``ValueError`` naming the file, the bad key and the
allowed ones.
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

from qkv.config import ModelConfig
from qkv.config_migrate import FLAT
from qkv.training.config import TrainConfig
from qkv.validation import check_int, check_positive

__all__ = ["Grid", "load_grid", "builtin_grids", "check_overrides", "STATS", "DATA_FIELDS",
           "HARNESS_FIELDS"]

#: Statistics a grid can ask for (see :mod:`qkv.experiments.stats`).
STATS = ("self_attention_share", "saturation", "heads")
#: TrainConfig fields the harness sets itself.
HARNESS_FIELDS = ("corpus", "eval_corpus", "out", "tokenizer", "seed", "progress")
#: TrainConfig fields that decide the text and the tokenizer: the same for every variant.
DATA_FIELDS = ("eval_fraction", "vocab_size", "lowercase", "doc_sep", "text_field", "encoding_errors",
               "max_doc_bytes", "long_docs")
_TOP_KEYS = ("name", "question", "base", "variants", "extra_eval", "stats", "early_steps", "notes")
_EXTRA_EVAL_KEYS = ("length_factor",)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_TRAIN_FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig))
#: what a grid's "model" object may set: the config's fields and the flat short names (qkv.config_migrate.FLAT)
_MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig)) + tuple(FLAT) + ("global_every",)


@dataclass(frozen=True)
class Grid:
    """One ablation experiment: shared settings, named variants, extra evaluations and statistics.

    Attributes:
        name: short name (folder-safe).
        question: what the grid asks, in a sentence or two (goes into ``results.md``).
        variants: variant name → overrides (TrainConfig fields, ``model``, ``lr_scale``), in order.
        base: overrides shared by every variant.
        extra_eval: ``{"length_factor": k}`` or empty.
        stats: names from :data:`STATS`.
        early_steps: first steps watched by the ``saturation`` statistics.
        notes: free text.
        source: where the grid was read from.
    """

    name: str
    question: str
    variants: dict[str, dict[str, Any]]
    base: dict[str, Any] = field(default_factory=dict)
    extra_eval: dict[str, Any] = field(default_factory=dict)
    stats: tuple[str, ...] = ()
    early_steps: int = 20
    notes: str = ""
    source: str = ""

    @property
    def length_factor(self) -> int | None:
        return self.extra_eval.get("length_factor")

    def subset(self, names: Sequence[str]) -> Grid:
        """The same grid with only the variants ``names`` (kept in the grid's order).

        Raises:
            ValueError: an unknown or repeated name, or no name at all.
        """
        names = list(names)
        unknown = [n for n in names if n not in self.variants]
        if unknown:
            raise ValueError(f"grid {self.name!r} has no variant {', '.join(map(repr, unknown))}; "
                             f"its variants: {', '.join(self.variants)}")
        if not names or len(set(names)) != len(names):
            raise ValueError(f"variants {names!r}: give each of the grid's variants at most once, at least one")
        return dataclasses.replace(self, variants={k: v for k, v in self.variants.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        """The grid as its JSON file holds it (without ``source``)."""
        out = dataclasses.asdict(self)
        out.pop("source")
        out["stats"] = list(self.stats)
        return out

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<dict>") -> Grid:
        """Validate and build; every error names ``source``, the key and what is allowed."""
        where = source
        if not isinstance(data, dict):
            raise ValueError(f"{where}: a grid must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_TOP_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(_TOP_KEYS)}")
        for key in ("name", "question", "variants"):
            if key not in data:
                raise ValueError(f"{where}: missing key {key!r} (required: name, question, variants)")
        name, question = data["name"], data["question"]
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{where}: name={name!r} must be letters, digits, '.', '_', '+', '-'")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: question must be a non-empty string")
        base = data.get("base", {})
        check_overrides(f"{where}: base", base, variant=False)
        variants = data["variants"]
        if not isinstance(variants, dict) or not variants:
            raise ValueError(f"{where}: variants must be a non-empty object of name → overrides")
        for vname, over in variants.items():
            if not _NAME.match(vname):
                raise ValueError(f"{where}: variant name {vname!r} must be letters, digits, '.', '_', "
                                 "'+', '-' (it names a folder)")
            check_overrides(f"{where}: variant {vname!r}", over, variant=True)
        extra = data.get("extra_eval", {})
        if not isinstance(extra, dict):
            raise ValueError(f"{where}: extra_eval must be an object, e.g. {{\"length_factor\": 2}}")
        bad = sorted(set(extra) - set(_EXTRA_EVAL_KEYS))
        if bad:
            raise ValueError(f"{where}: extra_eval: unknown key(s) {bad}; "
                             f"allowed: {', '.join(_EXTRA_EVAL_KEYS)}")
        check_int("extra_eval.length_factor", extra.get("length_factor"), low=2, optional=True,
                  where=f"{where}: ")
        stats = data.get("stats", [])
        if not isinstance(stats, list) or any(s not in STATS for s in stats):
            raise ValueError(f"{where}: stats={stats!r} must be a list of names from: {', '.join(STATS)}")
        early = data.get("early_steps", 20)
        check_int("early_steps", early, low=1, where=f"{where}: ")
        notes = data.get("notes", "")
        if not isinstance(notes, str):
            raise ValueError(f"{where}: notes must be a string")
        return cls(name, question.strip(), {k: _copy(v) for k, v in variants.items()}, _copy(base),
                   dict(extra), tuple(dict.fromkeys(stats)), early, notes, source)


def _copy(over: dict) -> dict:
    return json.loads(json.dumps(over))


def check_overrides(where: str, over: Any, *, variant: bool) -> None:
    """Check the keys of a ``base``/variant/``--set`` override dict (values are checked when the
    configs are built). Raises ``ValueError`` naming the bad key and the allowed ones."""
    if not isinstance(over, dict):
        raise ValueError(f"{where}: overrides must be an object of TrainConfig fields and 'model', "
                         f"got {over!r}")
    allowed = [n for n in _TRAIN_FIELDS if n not in HARNESS_FIELDS and (not variant or n not in DATA_FIELDS)]
    allowed += ["model"] + (["lr_scale"] if variant else [])
    for key, value in over.items():
        if key in HARNESS_FIELDS:
            raise ValueError(f"{where}: {key!r} is set by the harness (from the command line) and cannot "
                             "be overridden")
        if variant and key in DATA_FIELDS:
            raise ValueError(f"{where}: {key!r} decides the data or tokenizer, which every variant shares; "
                             "set it in the grid's base instead")
        if key not in allowed:
            hint = " (a ModelConfig field: put it under \"model\")" if key in _MODEL_FIELDS else ""
            raise ValueError(f"{where}: unknown key {key!r}{hint}; allowed: {', '.join(allowed)}")
        if key == "lr_scale":
            check_positive("lr_scale", value, where=f"{where}: ")
    model = over.get("model", {})
    if not isinstance(model, dict):
        raise ValueError(f"{where}: model must be an object of ModelConfig fields, got {model!r}")
    for key in model:
        if key == "vocab_size":
            raise ValueError(f"{where}: model.vocab_size comes from the shared tokenizer; set the "
                             "TrainConfig field vocab_size in base instead")
        if key not in _MODEL_FIELDS:
            raise ValueError(f"{where}: unknown model key {key!r}; allowed: {', '.join(_MODEL_FIELDS)}")


def _grids_dir():
    return resources.files("qkv.experiments") / "grids"


def builtin_grids() -> dict[str, str]:
    """Built-in grid name → its question (in file-name order)."""
    out = {}
    for entry in sorted(_grids_dir().iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".json"):
            grid = Grid.from_dict(json.loads(entry.read_text(encoding="utf-8")), source=entry.name)
            out[grid.name] = grid.question
    return out


def load_grid(name_or_path: str | Path) -> Grid:
    """A built-in grid by name, or a grid file by path.

    Raises:
        ValueError: unknown name (listing the built-in ones), unreadable file, bad JSON (with
            line and column) or a bad grid (see :meth:`Grid.from_dict`).
    """
    text_path = str(name_or_path)
    path = Path(text_path).expanduser()
    if path.is_file() or text_path.endswith(".json") or "/" in text_path:
        if not path.is_file():
            raise ValueError(f"grid file not found: {path}")
        source, text = str(path), path.read_text(encoding="utf-8")
    else:
        entry = _grids_dir() / f"{text_path}.json"
        if not entry.is_file():
            raise ValueError(f"unknown grid {text_path!r}; built-in: {', '.join(builtin_grids())}; "
                             "or give the path of a .json grid file")
        source, text = f"built-in grid {text_path}", entry.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from e
    return Grid.from_dict(data, source=source)
