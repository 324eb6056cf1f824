"""``fill_mask``'s model input (``masked_ids``) and its top-k against a direct softmax over the vocabulary."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from analysis_support import pydoc_texts

from qkv.analysis.fill_mask import fill_mask, masked_ids


@pytest.fixture(scope="module")
def mlm_and_tokenizer():
    from qkv.config import ModelConfig
    from qkv.data.tokenizer import train_tokenizer
    from qkv.models.builders import build_model

    tok = train_tokenizer(pydoc_texts(40), vocab_size=300, max_chars=60_000)
    torch.manual_seed(0)
    model = build_model(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_len=32), masked_lm=True)
    return model.eval(), tok


def test_masked_ids_encode_each_side_around_the_mask(mlm_and_tokenizer):
    _, tok = mlm_and_tokenizer
    ids, where = masked_ids(tok, "the class [MASK] a function")
    left = tok.encode("the class", add_special_tokens=False)
    right = tok.encode(" a function", add_special_tokens=False)
    assert ids == [tok.special.cls, *left, tok.special.mask, *right, tok.special.sep]
    assert where == len(left) + 1
    for bad in ("no mask here", "[MASK] and [MASK]"):
        with pytest.raises(ValueError, match=r"exactly one \[MASK\]"):
            masked_ids(tok, bad)


def test_fill_mask_top_k_is_the_softmax_over_non_special_tokens(mlm_and_tokenizer):
    model, tok = mlm_and_tokenizer
    text = "the class [MASK] a function"
    [got] = fill_mask(model, tok, [text], k=4)
    ids, where = masked_ids(tok, text)
    with torch.no_grad():
        logits = model(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool)).logits[0, where].double()
    logits[list(tok.special.ids)] = -np.inf  # fill_mask never predicts a special token
    probs = torch.softmax(logits, -1).numpy()
    order = np.argsort(-probs, kind="stable")[:4]
    assert [t for t, _ in got.top] == [tok.id_to_token(int(i)) for i in order]
    np.testing.assert_allclose([p for _, p in got.top], probs[order], rtol=1e-9)
