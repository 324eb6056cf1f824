"""The attention lab: synthetic tasks a small model learns in CPU-minutes, and the runs that train on them.

* :mod:`qkv.lab.tasks` — seeded, endless streams of (source, target) token sequences (``reverse``,
  ``sort``; a registry for more);
* :mod:`qkv.lab.seq2seq` — trains an encoder–decoder on a task and measures exact match;
* :mod:`qkv.lab.synthetic` — per-position tasks for an encoder with a masked-LM head (``mqar``,
  ``two_lookup``, ``copy``, ``reverse``, ``copy_offset``, ``attend_away``), built from
  :mod:`qkv.lab.recall_tasks`, :mod:`qkv.lab.position_tasks` and their shared parts in
  :mod:`qkv.lab.streams`.
"""

from __future__ import annotations

from qkv.lab.tasks import TASKS, Task, get_task, register_task

__all__ = ["TASKS", "Task", "get_task", "register_task"]
