"""The ablation harness (``qkv ablate``): train the variants of a grid under equal conditions.

    from qkv.experiments import AblationConfig, run_ablation
    result = run_ablation(AblationConfig(grid="projections", corpus=("dataset:20newsgroups",),
                                         out="runs/ablate-projections", seeds=3,
                                         overrides={"steps": 2000, "batch_size": 16}))
    print(result.table)

Modules: :mod:`~qkv.experiments.grid` (the grid file format), :mod:`~qkv.experiments.plan` (variants ×
seeds → run configs), :mod:`~qkv.experiments.data` (the shared tokenizer and held-out text),
:mod:`~qkv.experiments.worker` (train and measure one run), :mod:`~qkv.experiments.stats` (self-attention
share, saturation, early gradient norms), :mod:`~qkv.experiments.report` (CSV, Markdown, plot), :mod:`~qkv.experiments.ranking` (paired
rankings over seeds),
:mod:`~qkv.experiments.reuse` (copy the same run from another folder),
:mod:`~qkv.experiments.runner` (skip, resume, parallel processes). See docs/experiments.md.
"""

__all__ = ["Grid", "load_grid", "builtin_grids", "AblationConfig", "AblationResult", "run_ablation"]

# imported on first use, so that registering the ``qkv ablate`` command line stays light
_LAZY = {"Grid": "qkv.experiments.grid", "load_grid": "qkv.experiments.grid", "builtin_grids": "qkv.experiments.grid",
         "AblationConfig": "qkv.experiments.runner", "AblationResult": "qkv.experiments.runner",
         "run_ablation": "qkv.experiments.runner"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'qkv.experiments' has no attribute {name!r}")
