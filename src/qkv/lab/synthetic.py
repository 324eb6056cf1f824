"""Synthetic per-position tasks for an encoder: seeded, endless, deterministic per ``(seed, index)``.

Each task draws batches for a *bidirectional* encoder trained with a per-token softmax over the
vocabulary (the masked-LM head of :func:`qkv.models.builders.build_masked_lm` does): ``labels``
hold the target id at each scored position and -100 (:data:`IGNORE`) everywhere else, so
``model(input_ids, attention_mask, labels=labels).loss`` is the task's loss. A task answers the
same batch for the same ``(seed, index)`` and another stream for another seed.

Legend: B batch, T sequence length.

Token ids (every task): 0 ``[PAD]``, 1 ``[MASK]`` (a blank slot to fill), 2 ``[SEP]``, 3 ``[A]``,
4 ``[B]`` (table markers), then the task's symbols from id 5 (:data:`FIRST_SYMBOL`) on; a task's
``vocab`` names every id and ``vocab_size`` (≤ 256) counts them. In the examples below ``k3`` is
key 3, ``v1`` value 1, ``a`` a symbol, ``-`` an unscored position (label -100).

* ``mqar`` — multi-query associative recall (Arora et al. 2023, "Zoology"): ``n_pairs`` key–value
  pairs (distinct keys from ``n_keys``, values from a disjoint alphabet of ``n_values``), ``[SEP]``,
  then ``n_queries`` distinct keys of those pairs; each query token is labelled with its key's
  value. Zoology's causal model predicts the value at the token *after* a query, between random
  filler; here the label sits on the query token itself and there is no filler::

      input   k3 v2 k0 v4 k7 v1 [SEP] k7 k3
      labels   -  -  -  -  -  -   -   v1 v2

  A value must first be bound to its key (the value token attends to the token before it), then
  a query finds the pair whose key matches: two attention steps, so ≥ 2 layers.
* ``two_lookup`` — two tables, each holding a value for the same ``n_pairs`` keys, written as
  triples ``[A] k a`` and ``[B] k b`` shuffled together; after ``[SEP]`` come ``n_queries`` keys,
  each labelled ``(A[k] + B[k]) mod n_values`` (``combine="sum"``) or ``(A[k] − B[k]) mod
  n_values`` (``"difference"``)::

      input   [B] k4 v9 [A] k1 v3 [A] k4 v5 [B] k1 v7 [SEP] k4 k1      (n_values = 10, sum)
      labels    -  -  -   -  -  -   -  -  -   -  -  -   -   v4 v0

  ``combine="pair"`` labels the ordered pair ``(A[k], B[k])`` itself (one id per pair after the
  values): the two retrievals without any arithmetic for the feed-forward to learn.

  Why one head is expected to fail and two to suffice: the answer needs two values at two
  different places. A head's output at the query is *one* softmax-weighted average of value
  vectors; to carry both ``a`` and ``b`` it must split its weight between the two entries of
  ``k`` and keep the two values apart inside its D-wide value space (and, for ``"difference"``,
  keep which table each came from). That is possible in principle — weights ½ and ½ into
  disjoint subspaces — but it halves each signal, and the split must hold for every query;
  two heads each put their whole weight on one entry (one on ``[A] k``, one on ``[B] k``) and the
  feed-forward combines them. So the claim is the lab's hypothesis, not a theorem: one head
  learns it slowly or not at all, two learn it. ``"difference"`` is the stricter form: an average
  that forgets which table a value came from cannot answer it.
* ``copy``, ``reverse`` — a source of ``L`` symbols then ``L`` ``[MASK]`` slots; slot ``j``
  (position ``L + j``) is labelled with source symbol ``j`` (copy) or ``L − 1 − j`` (reverse)::

      input   a b c [MASK] [MASK] [MASK]
      copy    - - -   a      b      c
      reverse - - -   c      b      a

  Training rows have ``L`` drawn from ``min_len … train_len`` (≤ 32), padded with ``[PAD]``;
  ``batch(…, length=64)`` draws every row at one ``L`` (64, 128, … up to 256) to test length
  generalisation of a position scheme. Copy reads a fixed *distance* back (``L``); reverse reads
  distance ``2j + 1``, whatever ``L``.
* ``copy_offset`` — a row of ``L`` symbols, no blanks; position ``i`` is labelled with the symbol
  at ``i − shift`` (the first ``shift`` positions are unscored)::

      input   a b c d e        (shift = 2)
      labels  - - a b c

  Pure relative position: the answer is ``shift`` places back, whatever the content or ``L``.
* ``neighbours`` — a row of ``L`` symbols; position ``i`` is labelled with a function of the
  symbols at ``i + o`` for each offset ``o`` of ``offsets`` (default ``(-1, 1)``): the ordered tuple
  itself (``combine="tuple"``, one label id per tuple), their sum mod n (``"sum"``) or, for two
  offsets, their difference mod n (``"difference"``); positions missing a neighbour are unscored::

      input   a b c d          (offsets (-1, 1), tuple)
      labels  - (a,c) (b,d) -

  Several reads at fixed offsets: a head's output is one weighted average of value vectors, so
  one head must hold every neighbour in one mixture (unequal weights keep them apart), while
  as many heads as reads can each take one.
* ``attend_away`` — ``n_pairs`` pairs, each pair two positions (shuffled) whose tokens share a pair
  marker ``p`` and each carry a symbol: token ``p:a``. Every position is labelled with the
  *other* member's symbol (label ids are the plain symbols ``a``, ``b``, …)::

      input   q:b p:a q:c p:a
      labels   c   a   b   a

  Attention on the raw embeddings (``qkv_proj=False``: score ``x_i·x_j``) is expected to fail: a
  dot product of a vector with itself is at least its dot product with any vector of the same
  norm, so each token puts the most weight on *itself*, whose symbol says nothing about the
  label. Learned maps make the score ``x_i W_q W_kᵀ x_j`` an indefinite form that can prefer
  the partner (same marker) over the token itself.

Chance (``chance``) is the exact-match accuracy of the best input-blind guess per scored token:
``1 / n_values`` or ``1 / n_symbols``, as every label is uniform over its alphabet.
:func:`accuracy` scores token-level exact match over the scored positions,
:func:`sequence_accuracy` the rows with every scored position right.
"""
from __future__ import annotations

import dataclasses

from qkv.lab.position_tasks import Copy, CopyOffset, Neighbours, Reverse
from qkv.lab.recall_tasks import MQAR, AttendAway, TwoLookup
from qkv.lab.streams import (FIRST_SYMBOL, IGNORE, MARK_A, MARK_B, MASK, MAX_EVAL_LEN, MAX_TRAIN_LEN,
                             MAX_VOCAB, PAD, SEP, SPECIALS, SyntheticBatch, accuracy, sequence_accuracy)

__all__ = ["SyntheticBatch", "SYNTHETIC_TASKS", "get_synthetic_task", "accuracy", "sequence_accuracy",
           "SPECIALS", "PAD", "MASK", "SEP", "MARK_A", "MARK_B", "FIRST_SYMBOL", "IGNORE", "MAX_VOCAB",
           "MAX_TRAIN_LEN", "MAX_EVAL_LEN", "MQAR", "TwoLookup", "Copy", "Reverse", "CopyOffset", "Neighbours",
           "AttendAway"]

#: Task name → class.
SYNTHETIC_TASKS: dict[str, type] = {cls.name: cls for cls in (MQAR, TwoLookup, Copy, Reverse, CopyOffset, Neighbours,
                                                              AttendAway)}


def get_synthetic_task(name: str, **options):
    """The task ``name`` built with ``options``; ``ValueError`` naming an unknown name or option."""
    if name not in SYNTHETIC_TASKS:
        raise ValueError(f"unknown synthetic task {name!r}; allowed: {', '.join(SYNTHETIC_TASKS)}")
    cls = SYNTHETIC_TASKS[name]
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for synthetic task {name!r}; allowed: "
                         f"{', '.join(allowed)}")
    return cls(**options)
