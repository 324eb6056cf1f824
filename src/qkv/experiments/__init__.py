"""The ablation harness (``qkv ablate``): train the variants of a grid under equal conditions.

    from qkv.experiments.runner import AblationConfig, run_ablation
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

Import each name from the module that defines it."""
