"""The pipeline base: a task states how it runs its texts (a subclass without ``run`` cannot be
instantiated), and every pipeline of the package does."""

from __future__ import annotations

import inspect

import pytest

from qkv.pipelines.base import Pipeline
from qkv.pipelines.classification import TextClassificationPipeline, TokenClassificationPipeline
from qkv.pipelines.features import FeatureExtractionPipeline, TextGenerationPipeline
from qkv.pipelines.fill_mask import FillMaskPipeline


def test_a_pipeline_without_run_cannot_be_instantiated():
    class Silent(Pipeline):
        task = "silent"

    with pytest.raises(TypeError, match="abstract.*run"):
        Silent("no model is read: the class is refused first")


def test_every_pipeline_of_the_package_runs_its_texts():
    def subclasses(cls):
        return {cls} | {s for sub in cls.__subclasses__() for s in subclasses(sub)}

    ours = {c for c in subclasses(Pipeline) - {Pipeline} if c.__module__.startswith("qkv.")}
    assert ours >= {TextClassificationPipeline, TokenClassificationPipeline, FeatureExtractionPipeline,
                    TextGenerationPipeline, FillMaskPipeline}
    assert sorted(c.__name__ for c in ours if inspect.isabstract(c)) == []
