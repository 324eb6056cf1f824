"""The attention lab: synthetic tasks a small model learns in CPU-minutes, and the runs that train on them.

* :mod:`qkv.lab.tasks` — seeded, endless streams of (source, target) token sequences (``reverse``,
  ``sort``; a registry for more);
* :mod:`qkv.lab.seq2seq` — trains an encoder–decoder on a task (the sequence-to-sequence objective on
  the training engine) and measures exact match;
* :mod:`qkv.lab.synthetic` — per-position tasks for an encoder with a masked-LM head (``mqar``,
  ``two_lookup``, ``copy``, ``reverse``, ``copy_offset``, ``attend_away``), built from
  :mod:`qkv.lab.recall_tasks`, :mod:`qkv.lab.position_tasks` and their shared parts in
  :mod:`qkv.lab.streams`;
* :mod:`qkv.lab.encoder_run` — trains an encoder with a masked-LM head on one of them (the
  synthetic-task objective on the training engine; its configuration in :mod:`qkv.lab.encoder_config`)
  and measures held-out exact match (also at longer lengths), attention entropy and gradient norms
  at initialisation.

Import each name from the module that defines it."""
