"""The position tasks: every label of a decoded batch recomputed in plain Python from the input
tokens, the docstring examples, one tiny batch written out in full, training lengths, the
evaluation lengths 64 and 128 (one length per row, no padding), and the option checks."""

from __future__ import annotations

import pytest

from qkv.lab.position_tasks import Copy, CopyOffset, Neighbours, Reverse
from qkv.lab.streams import MAX_EVAL_LEN


def decode(task, batch):
    """Rows of (input names, label names or '-', mask as 0/1)."""
    return [([task.vocab[i] for i in ids], ["-" if y == -100 else task.vocab[y] for y in labels], mask)
            for ids, labels, mask in zip(batch.input_ids.tolist(), batch.labels.tolist(),
                                         batch.attention_mask.int().tolist())]


# --- plain-Python references over token names ------------------------------------------------------

def blanks_labels(tokens: list[str], reverse: bool) -> list[str]:
    """``s_0 … s_{L-1} [MASK]×L [PAD]…``: slot j gets s_j (copy) or s_{L-1-j} (reverse)."""
    L = tokens.index("[MASK]")
    src = tokens[:L]
    assert "[MASK]" not in src and "[PAD]" not in src
    assert tokens[L:2 * L] == ["[MASK]"] * L and set(tokens[2 * L:]) <= {"[PAD]"}
    read = src[::-1] if reverse else src
    return ["-"] * L + read + ["-"] * (len(tokens) - 2 * L)


def offset_labels(tokens: list[str], shift: int) -> list[str]:
    n = tokens.index("[PAD]") if "[PAD]" in tokens else len(tokens)
    assert set(tokens[n:]) <= {"[PAD]"}
    return ["-" if i < shift or i >= n else tokens[i - shift] for i in range(len(tokens))]


def test_the_references_reproduce_the_docstring_examples():
    row = "a b c [MASK] [MASK] [MASK]".split()
    assert blanks_labels(row, reverse=False) == "- - - a b c".split()
    assert blanks_labels(row, reverse=True) == "- - - c b a".split()
    assert offset_labels("a b c d e".split(), 2) == "- - a b c".split()


# --- every label of decoded batches ------------------------------------------------------------------

@pytest.mark.parametrize("cls", [Copy, Reverse])
@pytest.mark.parametrize("length", [None, 64, 128])
def test_copy_and_reverse_labels_match_the_reference(cls, length):
    task = cls(n_symbols=6, min_len=2, train_len=12)
    rows = decode(task, task.batch(5, 48, seed=1, length=length))
    lengths = set()
    for tokens, labels, mask in rows:
        assert labels == blanks_labels(tokens, cls is Reverse)
        L = tokens.index("[MASK]")
        lengths.add(L)
        assert mask == [1] * (2 * L) + [0] * (len(tokens) - 2 * L)
    if length is None:
        assert lengths <= set(range(2, 13)) and len(lengths) > 5  # drawn from min_len … train_len
        assert len(rows[0][0]) == 2 * max(lengths) <= task.max_len == 24
    else:
        assert lengths == {length} and len(rows[0][0]) == task.seq_len(length) == 2 * length
        assert all(m == [1] * (2 * length) for _, _, m in rows)


@pytest.mark.parametrize("length", [None, 64, 128])
def test_copy_offset_labels_match_the_reference(length):
    task = CopyOffset(n_symbols=5, shift=3, min_len=4, train_len=13)
    rows = decode(task, task.batch(2, 48, seed=8, length=length))
    lengths = set()
    for tokens, labels, mask in rows:
        assert labels == offset_labels(tokens, 3)
        n = sum(mask)
        lengths.add(n)
        assert mask == [1] * n + [0] * (len(tokens) - n) and "[PAD]" not in tokens[:n]
    if length is None:
        assert lengths <= set(range(4, 14)) and len(lengths) > 5
        assert len(rows[0][0]) == max(lengths) <= task.max_len == 13
    else:
        assert lengths == {length} and len(rows[0][0]) == task.seq_len(length) == length


def test_the_longest_evaluation_length_fits():
    b = Reverse().batch(0, 2, length=MAX_EVAL_LEN)
    assert b.input_ids.shape == (2, 2 * MAX_EVAL_LEN)
    assert CopyOffset().batch(0, 2, length=MAX_EVAL_LEN).input_ids.shape == (2, MAX_EVAL_LEN)


@pytest.mark.parametrize("task, rows", [
    (Copy(n_symbols=4, min_len=2, train_len=3),
     [("b c d [MASK] [MASK] [MASK]", "- - - b c d"),
      ("a a [MASK] [MASK] [PAD] [PAD]", "- - a a - -")]),
    (Reverse(n_symbols=4, min_len=2, train_len=3),
     [("b c d [MASK] [MASK] [MASK]", "- - - d c b"),
      ("a a [MASK] [MASK] [PAD] [PAD]", "- - a a - -")]),
    (CopyOffset(n_symbols=4, shift=2, min_len=3, train_len=5),
     [("b c d a a", "- - b c d"),
      ("a d d c a", "- - a d d")]),
])
def test_a_tiny_batch_written_out(task, rows):
    """Seed 0, batch 0, two rows: the inputs are what the stream draws, the labels worked out by hand."""
    got = [(" ".join(t), " ".join(y)) for t, y, _ in decode(task, task.batch(0, 2, seed=0))]
    assert got == rows


def test_vocabularies_and_chance():
    assert Copy(n_symbols=3).vocab == ("[PAD]", "[MASK]", "[SEP]", "[A]", "[B]", "a", "b", "c")
    assert Reverse(n_symbols=30).vocab[-5:] == ("z", "s26", "s27", "s28", "s29")
    assert CopyOffset(n_symbols=8).chance == 1 / 8 and Copy().vocab_size == 5 + 16


@pytest.mark.parametrize("cls, opts, message", [
    (Copy, dict(train_len=33), r"need min_len ≤ train_len ≤ 32, got min_len=1, train_len=33"),
    (Reverse, dict(min_len=5, train_len=4), r"need min_len ≤ train_len ≤ 32, got min_len=5, train_len=4"),
    (Copy, dict(n_symbols=1), "n_symbols=1 must be an int ≥ 2"),
    (Copy, dict(n_symbols=300), r"copy: vocab_size=305 .* exceeds 256"),
    (Reverse, dict(min_len=0), "min_len=0 must be an int ≥ 1"),
    (CopyOffset, dict(shift=0), "shift=0 must be an int ≥ 1"),
    (CopyOffset, dict(shift=4, min_len=4), r"min_len=4 must be > shift=4 \(a row needs a scored position\)"),
    (CopyOffset, dict(train_len=True), "train_len=True must be an int ≥ 1"),
])
def test_bad_options_are_refused(cls, opts, message):
    with pytest.raises(ValueError, match=message):
        cls(**opts)


@pytest.mark.parametrize("task, length, message", [
    (Copy(), 0, r"length=0 must be an int in \[1, 256\] \(copy\)"),
    (Reverse(), 257, r"length=257 must be an int in \[1, 256\] \(reverse\)"),
    (Copy(), 64.0, r"length=64.0 must be an int"),
    (CopyOffset(shift=2), 2, r"length=2 must be an int in \[3, 256\] \(copy_offset\)"),
])
def test_bad_evaluation_lengths_are_refused(task, length, message):
    with pytest.raises(ValueError, match=message):
        task.batch(0, 4, length=length)


def neighbours_labels(tokens: list[str], offsets, combine: str, n: int) -> list[str]:
    """Position i: f(s[i+o] for o in offsets) when all are inside the row, else '-'."""
    length = tokens.index("[PAD]") if "[PAD]" in tokens else len(tokens)
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = []
    for i in range(len(tokens)):
        if not all(0 <= i + o < length for o in offsets):
            out.append("-")
            continue
        got = [tokens[i + o] for o in offsets]
        if combine == "tuple":
            out.append("(" + ",".join(got) + ")")
        elif combine == "sum":
            out.append(letters[sum(letters.index(x) for x in got) % n])
        else:
            out.append(letters[(letters.index(got[0]) - letters.index(got[1])) % n])
    return out


@pytest.mark.parametrize("offsets,combine", [((-2, 1), "tuple"), ((-1, 1, 2), "tuple"), ((-2, -1, 3), "sum"),
                                             ((1, -1), "difference")])
@pytest.mark.parametrize("length", [None, 64])
def test_neighbours_labels_match_the_reference(offsets, combine, length):
    task = Neighbours(n_symbols=4, offsets=offsets, combine=combine, min_len=6, train_len=15)
    rows = decode(task, task.batch(1, 40, seed=3, length=length))
    lengths = set()
    for tokens, labels, mask in rows:
        assert labels == neighbours_labels(tokens, offsets, combine, 4)
        lengths.add(sum(mask))
    assert lengths == {64} if length else max(lengths) <= 15 and len(lengths) > 3


def test_neighbours_written_out_vocab_chance_and_refusals():
    task = Neighbours(n_symbols=3, min_len=4, train_len=4)
    b = task.batch(0, 1, seed=0)
    tokens = [task.vocab[i] for i in b.input_ids[0]]
    assert [task.vocab[y] if y >= 0 else "-" for y in b.labels[0].tolist()] == \
        ["-", f"({tokens[0]},{tokens[2]})", f"({tokens[1]},{tokens[3]})", "-"]
    assert task.vocab_size == 5 + 3 + 9 and task.chance == pytest.approx(1 / 9)
    assert task.vocab[8:11] == ("(a,a)", "(a,b)", "(a,c)")
    assert Neighbours(n_symbols=3, offsets=[-1, 1, 2], min_len=5).vocab_size == 5 + 3 + 27
    assert Neighbours(n_symbols=3, offsets=[-1, 1]).offsets == (-1, 1)  # a JSON list becomes a tuple
    assert Neighbours(n_symbols=3, combine="sum").vocab_size == 8
    assert Neighbours(n_symbols=3, combine="difference").chance == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="combine='avg' is not allowed; allowed: tuple, sum, difference"):
        Neighbours(combine="avg")
    with pytest.raises(ValueError, match=r"min_len=4 must be > 4, the span of offsets \(-2, 2\)"):
        Neighbours(offsets=(-2, 2))
    for bad in [(0, 1), (), (1, 1), (1.5,)]:
        with pytest.raises(ValueError, match="must be distinct non-zero ints"):
            Neighbours(offsets=bad)
    with pytest.raises(ValueError, match="needs exactly two offsets"):
        Neighbours(offsets=(-1, 1, 2), combine="difference", min_len=5)
