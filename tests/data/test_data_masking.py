"""Dynamic MLM masking: rates, special tokens, whole words, determinism (qkv.data.masking)."""

from __future__ import annotations

import pytest
import torch

from qkv.data.masking import IGNORE_INDEX, MaskingConfig, mask_tokens, position_generators
from qkv.data.packing import PackedBlocks


@pytest.fixture(scope="module")
def blocks(pydoc_cache, pydoc_tokenizer):
    """All pydoc text as (B,T) = (~1000, 128) blocks: ~130k tokens."""
    packed = PackedBlocks(pydoc_cache, 128, pydoc_tokenizer.special)
    return packed.batch(range(len(packed)))


def _stats(ids, out, labels, special, mask_id):
    real = ~torch.isin(ids, torch.tensor(special))
    sel = labels != IGNORE_INDEX
    n_sel = int(sel.sum())
    return {
        "n_real": int(real.sum()),
        "selected": n_sel / int(real.sum()),
        "special_selected": int((sel & ~real).sum()),
        "mask": int((sel & (out == mask_id)).sum()) / n_sel,
        "random": int((sel & (out != mask_id) & (out != ids)).sum()) / n_sel,
        "unchanged": int((sel & (out == ids)).sum()) / n_sel,
        "changed_unselected": int((~sel & (out != ids)).sum()),
        "labels_ok": bool((labels[sel] == ids[sel]).all()),
    }


@pytest.mark.parametrize("cfg,rates", [
    (MaskingConfig(), (0.15, 0.8, 0.1, 0.1)),
    (MaskingConfig(select_rate=0.3, mask_rate=0.5, random_rate=0.2), (0.3, 0.5, 0.2, 0.3)),
])
def test_masking_statistics_over_100k_tokens(blocks, pydoc_tokenizer, cfg, rates):
    sp, V = pydoc_tokenizer.special, pydoc_tokenizer.vocab_size
    g = torch.Generator().manual_seed(0)
    outs = [mask_tokens(blocks.input_ids, sp, V, cfg, generator=g) for _ in range(3)]  # 3 dynamic passes
    ids = blocks.input_ids.repeat(3, 1)
    out = torch.cat([o for o, _ in outs])
    labels = torch.cat([la for _, la in outs])
    s = _stats(ids, out, labels, sp.ids, sp.mask)
    assert s["n_real"] >= 300_000
    assert abs(s["selected"] - rates[0]) < 0.005
    assert abs(s["mask"] - rates[1]) < 0.01
    assert abs(s["random"] - rates[2]) < 0.01  # (a random draw equal to the original counts as unchanged)
    assert abs(s["unchanged"] - rates[3]) < 0.01
    assert s["special_selected"] == 0 and s["changed_unselected"] == 0 and s["labels_ok"]
    assert (labels[labels == IGNORE_INDEX].numel() + int((labels != IGNORE_INDEX).sum())) == labels.numel()
    replaced = (labels != IGNORE_INDEX) & (out != sp.mask) & (out != ids)
    assert not torch.isin(out[replaced], torch.tensor(sp.ids)).any()  # random tokens never special
    assert int(out[replaced].max()) < V


def test_new_mask_each_call_and_seeded(blocks, pydoc_tokenizer):
    sp, V = pydoc_tokenizer.special, pydoc_tokenizer.vocab_size
    x = blocks.input_ids[:64]
    g = torch.Generator().manual_seed(5)
    a, b = mask_tokens(x, sp, V, generator=g), mask_tokens(x, sp, V, generator=g)
    assert not torch.equal(a[1], b[1])
    again = mask_tokens(x, sp, V, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a[0], again[0]) and torch.equal(a[1], again[1])
    assert torch.equal(x, blocks.input_ids[:64])  # input untouched


def test_per_row_generators_make_rows_independent_of_batching(blocks, pydoc_tokenizer):
    sp, V = pydoc_tokenizer.special, pydoc_tokenizer.vocab_size
    x = blocks.input_ids[:8]
    whole = mask_tokens(x, sp, V, generator=position_generators(7, range(100, 108)))
    halves = [mask_tokens(x[i:i + 4], sp, V, generator=position_generators(7, range(100 + i, 104 + i)))
              for i in (0, 4)]
    assert torch.equal(whole[0], torch.cat([h[0] for h in halves]))
    assert torch.equal(whole[1], torch.cat([h[1] for h in halves]))
    other_epoch = mask_tokens(x, sp, V, generator=position_generators(7, range(200, 208)))
    assert not torch.equal(whole[1], other_epoch[1])


def _words(ids_row, starts_row, special):
    """Independent grouping: a word is a start token plus the non-start tokens after it;
    special tokens are never part of a word."""
    words, cur = [], []
    for t, (tok, st) in enumerate(zip(ids_row, starts_row)):
        if tok in special:
            if cur:
                words.append(cur)
            cur = []
            continue
        if st and cur:
            words.append(cur)
            cur = []
        cur.append(t)
    if cur:
        words.append(cur)
    return words


def test_whole_word_masking_selects_all_pieces_or_none(blocks, pydoc_tokenizer):
    sp, V = pydoc_tokenizer.special, pydoc_tokenizer.vocab_size
    cfg = MaskingConfig(whole_word=True)
    out, labels = mask_tokens(blocks.input_ids, sp, V, cfg, word_starts=blocks.word_starts,
                              generator=torch.Generator().manual_seed(1))
    sel = (labels != IGNORE_INDEX).tolist()
    n_multi = n_multi_selected = 0
    for r in range(blocks.input_ids.shape[0]):
        for word in _words(blocks.input_ids[r].tolist(), blocks.word_starts[r].tolist(), set(sp.ids)):
            flags = {sel[r][t] for t in word}
            assert len(flags) == 1, (r, word)
            if len(word) > 1:
                n_multi += 1
                n_multi_selected += flags.pop()
    assert n_multi > 5000 and 0.12 < n_multi_selected / n_multi < 0.18
    s = _stats(blocks.input_ids, out, labels, sp.ids, sp.mask)
    assert abs(s["selected"] - 0.15) < 0.015 and s["special_selected"] == 0
    assert abs(s["mask"] - 0.8) < 0.02


def test_arguments_are_checked(pydoc_tokenizer):
    sp = pydoc_tokenizer.special
    with pytest.raises(ValueError, match="mask_rate \\+ random_rate"):
        MaskingConfig(mask_rate=0.9, random_rate=0.2)
    with pytest.raises(ValueError, match="select_rate"):
        MaskingConfig(select_rate=1.5)
    with pytest.raises(ValueError, match="word_starts"):
        mask_tokens(torch.zeros(2, 3, dtype=torch.long), sp, 50, MaskingConfig(whole_word=True))
    with pytest.raises(ValueError, match="one generator per row"):
        mask_tokens(torch.zeros(2, 3, dtype=torch.long), sp, 50, generator=position_generators(0, [1]))
    cfg = MaskingConfig()
    assert 1 - cfg.mask_rate - cfg.random_rate == pytest.approx(0.1)  # BERT: 10 % of chosen tokens kept


def test_fast_enough(blocks, pydoc_tokenizer):
    import time
    x = blocks.input_ids[:256]
    g = torch.Generator().manual_seed(0)
    mask_tokens(x, pydoc_tokenizer.special, pydoc_tokenizer.vocab_size, generator=g)
    t0 = time.perf_counter()
    for _ in range(10):
        mask_tokens(x, pydoc_tokenizer.special, pydoc_tokenizer.vocab_size, MaskingConfig(whole_word=True),
                    word_starts=blocks.word_starts[:256], generator=g)
    assert (time.perf_counter() - t0) / 10 < 0.05  # 32k tokens well under 50 ms
