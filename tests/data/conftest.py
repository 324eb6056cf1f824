"""Shared fixtures of the data-pipeline tests: a small tokenizer and token cache on real text
(``dataset:pydoc``, always installed), built once per session."""

from __future__ import annotations

import pytest

from qkv.data import Corpus, build_token_cache, train_tokenizer

VOCAB = 997  # distinct from every other size in the tests


@pytest.fixture(scope="session")
def pydoc_tokenizer():
    return train_tokenizer(Corpus("dataset:pydoc"), vocab_size=VOCAB)


@pytest.fixture(scope="session")
def pydoc_cache(pydoc_tokenizer, tmp_path_factory):
    return build_token_cache(Corpus("dataset:pydoc"), pydoc_tokenizer, tmp_path_factory.mktemp("cache"))
