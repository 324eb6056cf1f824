"""The retrieval tasks: every label of a decoded batch recomputed in plain Python from the input
tokens (names, not ids), the references checked on the hand-written examples of the module
docstring, one tiny batch written out in full, and the option checks."""

from __future__ import annotations

import pytest

from qkv.lab.recall_tasks import MQAR, AttendAway, TwoLookup


def decode(task, batch):
    """Rows of (input names, label names or '-')."""
    rows = []
    for ids, labels in zip(batch.input_ids.tolist(), batch.labels.tolist()):
        rows.append(([task.vocab[i] for i in ids], ["-" if y == -100 else task.vocab[y] for y in labels]))
    return rows


# --- plain-Python references over token names ------------------------------------------------------

def mqar_labels(tokens: list[str]) -> list[str]:
    sep = tokens.index("[SEP]")
    pairs = tokens[:sep]
    table = dict(zip(pairs[0::2], pairs[1::2]))
    assert len(table) == len(pairs) // 2, "keys repeat"
    assert all(k.startswith("k") for k in table) and all(v.startswith("v") for v in table.values())
    queries = tokens[sep + 1:]
    assert len(set(queries)) == len(queries), "queries repeat"
    return ["-"] * (sep + 1) + [table[q] for q in queries]


def two_lookup_labels(tokens: list[str], n_values: int, combine: str) -> list[str]:
    sep = tokens.index("[SEP]")
    tables = {"[A]": {}, "[B]": {}}
    for i in range(0, sep, 3):
        marker, key, value = tokens[i:i + 3]
        assert key not in tables[marker], "a key twice in one table"
        tables[marker][key] = int(value[1:])
    assert tables["[A]"].keys() == tables["[B]"].keys()
    out = ["-"] * (sep + 1)
    for q in tokens[sep + 1:]:
        a, b = tables["[A]"][q], tables["[B]"][q]
        if combine == "pair":
            out.append(f"(v{a},v{b})")
        else:
            out.append(f"v{(a + b) % n_values if combine == 'sum' else (a - b) % n_values}")
    return out


def attend_away_labels(tokens: list[str]) -> list[str]:
    out = []
    for i, tok in enumerate(tokens):
        marker = tok.split(":")[0]
        partners = [j for j, other in enumerate(tokens) if j != i and other.split(":")[0] == marker]
        assert len(partners) == 1, f"{tok} has {len(partners)} partners"
        out.append(tokens[partners[0]].split(":")[1])
    return out


def test_the_references_reproduce_the_docstring_examples():
    assert mqar_labels("k3 v2 k0 v4 k7 v1 [SEP] k7 k3".split()) == "- - - - - - - v1 v2".split()
    tl = "[B] k4 v9 [A] k1 v3 [A] k4 v5 [B] k1 v7 [SEP] k4 k1".split()
    assert two_lookup_labels(tl, 10, "sum") == ["-"] * 13 + ["v4", "v0"]
    assert two_lookup_labels(tl, 10, "difference") == ["-"] * 13 + ["v6", "v6"]  # 5-9, 3-7 mod 10
    assert attend_away_labels("q:b p:a q:c p:a".split()) == "c a b a".split()


# --- every label of decoded batches ------------------------------------------------------------------

@pytest.mark.parametrize("opts", [dict(), dict(n_keys=5, n_values=3, n_pairs=5, n_queries=2)])
def test_mqar_labels_match_the_reference(opts):
    task = MQAR(**opts)
    for tokens, labels in decode(task, task.batch(7, 64, seed=3)):
        assert len(tokens) == task.max_len == 2 * task.n_pairs + 1 + task.n_queries
        assert labels == mqar_labels(tokens)


@pytest.mark.parametrize("combine", ["sum", "difference", "pair"])
def test_two_lookup_labels_match_the_reference(combine):
    task = TwoLookup(n_keys=7, n_values=5, n_pairs=3, n_queries=3, combine=combine)
    for tokens, labels in decode(task, task.batch(2, 64, seed=9)):
        assert len(tokens) == task.max_len == 6 * 3 + 1 + 3
        assert [tokens[i] for i in range(0, 18, 3)].count("[A]") == 3  # three entries per table
        assert labels == two_lookup_labels(tokens, 5, combine)


def test_attend_away_labels_match_the_reference():
    task = AttendAway(n_symbols=4, n_markers=6, n_pairs=5)
    rows = decode(task, task.batch(1, 64, seed=4))
    for tokens, labels in rows:
        assert len(tokens) == 10 and len({t.split(":")[0] for t in tokens}) == 5
        assert labels == attend_away_labels(tokens)
    # the partner's symbol, not one's own: across rows they often differ
    differ = sum(t.split(":")[1] != y for tokens, labels in rows for t, y in zip(tokens, labels))
    assert differ > 0.5 * 64 * 10


@pytest.mark.parametrize("task, rows", [
    (MQAR(n_keys=4, n_values=3, n_pairs=2, n_queries=2),
     [("k3 v1 k1 v0 [SEP] k3 k1", "- - - - - v1 v0"),
      ("k1 v1 k0 v1 [SEP] k0 k1", "- - - - - v1 v1")]),
    (TwoLookup(n_keys=3, n_values=4, n_pairs=2, n_queries=1, combine="difference"),
     [("[A] k2 v0 [B] k1 v2 [A] k1 v0 [B] k2 v0 [SEP] k1", "- - - - - - - - - - - - - v2"),  # 0-2 mod 4
      ("[A] k1 v3 [B] k1 v0 [B] k2 v1 [A] k2 v3 [SEP] k1", "- - - - - - - - - - - - - v3")]),  # 3-0
    (AttendAway(n_symbols=3, n_markers=2, n_pairs=2),
     [("p0:a p1:b p0:c p1:c", "c c a b"),
      ("p1:b p0:b p1:a p0:b", "a b b b")]),
])
def test_a_tiny_batch_written_out(task, rows):
    """Seed 0, batch 0, two rows: the inputs are what the stream draws, the labels worked out by hand."""
    assert [(" ".join(t), " ".join(y)) for t, y in decode(task, task.batch(0, 2, seed=0))] == rows


def test_vocabularies_and_chance():
    assert MQAR(n_keys=3, n_values=2, n_pairs=1, n_queries=1).vocab[5:] == ("k0", "k1", "k2", "v0", "v1")
    assert TwoLookup().vocab_size == 5 + 16 + 16 and TwoLookup(n_values=10).chance == 0.1
    aa = AttendAway(n_symbols=2, n_markers=2, n_pairs=1)
    assert aa.vocab[5:] == ("a", "b", "p0:a", "p0:b", "p1:a", "p1:b") and aa.chance == 0.5


@pytest.mark.parametrize("cls, opts, message", [
    (MQAR, dict(n_pairs=9, n_keys=8), r"n_pairs=9 must be ≤ n_keys=8 \(keys are distinct in a row\)"),
    (MQAR, dict(n_queries=9), r"n_queries=9 must be ≤ n_pairs=8"),
    (MQAR, dict(n_values=1), "n_values=1 must be an int ≥ 2"),
    (MQAR, dict(n_keys=200, n_values=100, n_pairs=8), r"mqar: vocab_size=305 .* exceeds 256"),
    (MQAR, dict(n_pairs=2.0), "n_pairs=2.0 must be an int ≥ 1"),
    (TwoLookup, dict(combine="product"), r"combine='product' is not allowed; allowed: sum, difference"),
    (TwoLookup, dict(n_pairs=5, n_keys=4), "n_pairs=5 must be ≤ n_keys=4"),
    (TwoLookup, dict(n_queries=0), "n_queries=0 must be an int ≥ 1"),
    (AttendAway, dict(n_pairs=9, n_markers=8), r"n_pairs=9 must be ≤ n_markers=8"),
    (AttendAway, dict(n_symbols=1), "n_symbols=1 must be an int ≥ 2"),
    (AttendAway, dict(n_symbols=32, n_markers=8), r"attend_away: vocab_size=293 .* exceeds 256"),
])
def test_bad_options_are_refused(cls, opts, message):
    with pytest.raises(ValueError, match=message):
        cls(**opts)


def test_two_lookup_pair_vocabulary_and_chance():
    task = TwoLookup(n_keys=4, n_values=3, n_pairs=2, n_queries=2, combine="pair")
    assert task.vocab_size == 5 + 4 + 3 + 9 == len(task.vocab)
    assert task.vocab[-9:] == ("(v0,v0)", "(v0,v1)", "(v0,v2)", "(v1,v0)", "(v1,v1)", "(v1,v2)", "(v2,v0)",
                               "(v2,v1)", "(v2,v2)")
    assert task.chance == pytest.approx(1 / 9)
    assert TwoLookup(n_keys=4, n_values=3, n_pairs=2, n_queries=2).vocab_size == 12  # sum: no pair labels
