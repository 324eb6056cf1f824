"""From a grid and the command line to one :class:`Job` per variant and seed.

Settings are layered, later wins: TrainConfig defaults < harness defaults (no progress bar; ten
held-out evaluations per run) < the grid's ``base`` < command-line overrides (``--steps``,
``--set``, …) < the variant. A variant's ``lr_scale`` then multiplies the learning rate, and with
``extra_eval.length_factor = k`` every variant's position table is made at least ``k × max_len``
long (unless the grid sets ``model.max_len``) so that the longer blocks fit.

Runs live in ``OUT/runs/<variant>/seed<k>/`` — ordinary ``qkv pretrain`` run folders.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qkv.experiments.grid import Grid, check_overrides
from qkv.config import PRESETS, ModelConfig
from qkv.training.config import TrainConfig, model_config_for

__all__ = ["Job", "resolve_variant", "validate_grid", "plan_jobs", "merge_overrides"]

_TRAIN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)
                   if f.default is not dataclasses.MISSING}
#: How many held-out evaluations a run makes when ``eval_every`` is not given.
EVAL_POINTS = 10


@dataclass(frozen=True)
class Job:
    """One training run of the grid.

    Attributes:
        variant: the variant's name. seed: its seed.
        run_dir: ``OUT/runs/<variant>/seed<seed>``.
        train_config: the full :class:`TrainConfig` as a dict.
        stats: statistics to compute (:data:`qkv.experiments.grid.STATS`).
        length_factor: evaluate also at this many times the training length (or ``None``).
        early_steps: first steps the ``saturation`` statistics watch.
    """

    variant: str
    seed: int
    run_dir: str
    train_config: dict[str, Any]
    stats: tuple[str, ...] = ()
    length_factor: int | None = None
    early_steps: int = 20

    @property
    def label(self) -> str:
        return f"{self.variant} seed {self.seed}"

    def config(self) -> TrainConfig:
        return TrainConfig.from_dict(self.train_config)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["stats"] = list(self.stats)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        return cls(**{**data, "stats": tuple(data.get("stats", ()))})


def merge_overrides(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers win; ``model`` dicts merge key by key."""
    out: dict[str, Any] = {}
    model: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key == "model":
                model.update(value)
            else:
                out[key] = value
    out["model"] = model
    return out


def resolve_variant(grid: Grid, variant: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The TrainConfig fields (except those the harness sets) of ``variant``."""
    if variant not in grid.variants:
        raise ValueError(f"grid {grid.name!r} has no variant {variant!r}; "
                         f"variants: {', '.join(grid.variants)}")
    var = dict(grid.variants[variant])
    lr_scale = var.pop("lr_scale", 1.0)
    d = merge_overrides({"progress": False}, grid.base, overrides or {}, var)
    d["lr"] = d.get("lr", _TRAIN_DEFAULTS["lr"]) * lr_scale
    steps = d.get("steps", _TRAIN_DEFAULTS["steps"])
    d.setdefault("eval_every", max(1, steps // EVAL_POINTS))
    factor = grid.length_factor
    if factor and "max_len" not in d["model"]:
        preset = d.get("preset", _TRAIN_DEFAULTS["preset"])
        table = PRESETS.get(preset, {}).get("max_len", ModelConfig.max_len)
        needed = factor * d.get("max_len", _TRAIN_DEFAULTS["max_len"])
        if table < needed:
            d["model"]["max_len"] = needed
    return d


def validate_grid(grid: Grid, overrides: dict[str, Any] | None = None) -> dict[str, TrainConfig]:
    """Build every variant's TrainConfig and ModelConfig (with a placeholder corpus), so that a bad
    value stops the harness before any data is read. Returns variant → TrainConfig."""
    check_overrides("--set/options", overrides or {}, variant=False)
    out = {}
    for variant in grid.variants:
        where = f"grid {grid.name!r}, variant {variant!r}"
        try:
            cfg = TrainConfig(corpus=("-",), out="-", **resolve_variant(grid, variant, overrides))
            model_config_for(cfg, hint="; set model.max_len")
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from e
        out[variant] = cfg
    return out


def plan_jobs(grid: Grid, out: Path, seeds: list[int], *, overrides: dict[str, Any] | None,
              data_fields: dict[str, Any]) -> list[Job]:
    """Every (variant, seed) run, seed-major (all variants of seed 0 first: an early, complete
    comparison). ``data_fields``: corpus, eval_corpus, tokenizer and reading options from
    :func:`qkv.experiments.data.prepare_shared_data`, the same for every run."""
    jobs = []
    for seed in seeds:
        for variant in grid.variants:
            fields = {**resolve_variant(grid, variant, overrides), **data_fields, "seed": seed}
            run_dir = Path(out) / "runs" / variant / f"seed{seed}"
            cfg = TrainConfig.from_dict({**fields, "out": str(run_dir)})
            jobs.append(Job(variant, seed, str(run_dir), cfg.to_dict(), grid.stats, grid.length_factor,
                            grid.early_steps))
    return jobs
