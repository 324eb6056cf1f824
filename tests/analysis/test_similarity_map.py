"""The token-pair map of an embedding similarity sums to the cosine the embedder gives, for every pooling."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.analysis.inputs import AnalysisInputError
from qkv.analysis.similarity_map import explain_similarity
from qkv.embeddings.embedder import Embedder
from qkv.embeddings.pooling import POOLINGS

A, B = "the cat sat on the mat", "a kitten was sitting on a rug"


def _cosine(folder, **options) -> float:
    va, vb = Embedder(folder, **options).embed([A, B])
    return float(va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb)))


@pytest.mark.parametrize("pooling", [*POOLINGS, "cls+mean+max"])
def test_contributions_sum_to_the_embedders_cosine(tiny_model, pooling):
    m = explain_similarity(tiny_model, A, B, pooling=pooling, layers=(-2, -1))
    assert m.contributions.shape == (len(m.tokens_a), len(m.tokens_b))
    assert m.tokens_a[0] == "[CLS]" and m.tokens_b[-1] == "[SEP]"
    assert m.contributions.sum() == pytest.approx(m.cosine, abs=1e-9)
    assert m.cosine == pytest.approx(_cosine(tiny_model, pooling=pooling, layers=(-2, -1)), abs=1e-5)
    if pooling == "cls":
        assert np.count_nonzero(m.contributions) == 1 and m.contributions[0, 0] == pytest.approx(m.cosine)
    pairs = m.top_pairs(3)
    assert len(pairs) == 3 and pairs[0][2] == pytest.approx(m.contributions.max())


def test_minilm_similarity_is_explained_by_its_word_pairs(minilm):
    m = explain_similarity(minilm, A, B)
    assert m.pooling == "mean"  # the folder's sentence-transformers settings
    assert m.contributions.sum() == pytest.approx(m.cosine, abs=1e-9)
    assert m.cosine == pytest.approx(_cosine(minilm), abs=1e-5)
    assert m.to_dict()["sum_of_contributions"] == pytest.approx(m.cosine)


def test_each_text_must_fit_one_window(tiny_model):
    with pytest.raises(AnalysisInputError, match="more than the embedding window of 32"):
        explain_similarity(tiny_model, "word " * 40, B)
    with pytest.raises(AnalysisInputError, match="text b is empty"):
        explain_similarity(tiny_model, A, "   ")
