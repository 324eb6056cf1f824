"""What every vision run does around its objective (image classification, captioning): check the
batch against the model sized for the data, open the run folder, return a finished run's report,
resolve the precision, check a resumed run's configuration and data or create its ``run.json``,
seed, and hand the objective to the one training engine.

A run's own module reads its data, sizes its model and writes its report; the rest is here, once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from qkv.data.errors import ImageDataError
from qkv.training.engine import run_training
from qkv.training.lifecycle import RunFolder, check_resume_data, resume_eval, run_session
from qkv.training.precision import resolve_precision

__all__ = ["VisionRun", "vision_run"]

#: The files a finished vision run holds (``--resume`` of one returns its report).
FINISHED_FILES = ("qkv.json", "model.safetensors", "report.json")


@dataclass
class VisionRun:
    """A vision run set up by :func:`vision_run`.

    Attributes:
        cfg: the run's (resolved) configuration. run: its folder. info: the processes' set-up.
        precision: the precision resolved for the device (``None`` for a finished run).
        report: a finished run's ``report.json`` (nothing is trained then), else ``None``.
    """

    cfg: Any
    run: RunFolder
    info: Any
    precision: str | None
    report: dict | None = None

    @property
    def steps_done(self) -> int:
        """The optimiser steps ``run.json`` records."""
        return int(self.run.meta().get("steps_done", 0))

    def train(self, objective, model, *, title: str, clock: Callable[[], float], on_backward=None):
        """:func:`~qkv.training.engine.run_training` of ``objective`` on ``model`` in this run."""
        return run_training(self.cfg, objective, model=model, run=self.run, info=self.info, precision=self.precision,
                            title=title, clock=clock, resume_eval=resume_eval, on_backward=on_backward)


@contextmanager
def vision_run(cfg, *, kind: str, what: str, model_config, summary: dict, fingerprint: Callable[[], str],
               resume: bool) -> Iterator[VisionRun]:
    """Set up the run of ``cfg`` (see the module docstring) for the ``with`` block.

    Args:
        cfg: the run's resolved configuration (``out``, ``device``, ``precision``, ``progress``, ``seed``).
        kind: ``run.json``'s ``kind`` and the ``--objective`` named in messages (``image``, ``caption``).
        what: the data's name in the message of a resume on other data (``images``, ``canvases``).
        model_config: the :class:`~qkv.config.ModelConfig` written to ``run.json``.
        summary: ``run.json``'s ``data`` entry. fingerprint: the data's sha256 (called once, unless finished).
        resume: continue the run in ``cfg.out``.

    Yields:
        :class:`VisionRun` — with ``report`` set when the run had already finished.

    Raises:
        ValueError: a batch of ``model_config``'s examples above the largest (checked before the folder).
        ImageDataError: a resume on other data than the run started with.
        RunError: the folder's problems (:mod:`qkv.training.lifecycle`).
    """
    cfg.check_batch_size(cfg.tokens_per_example(model_config))  # the batch again, in the model sized for the data
    with run_session(cfg.device, cfg.out, resume=resume) as (info, run):
        if resume and run.finished(cfg, files=FINISHED_FILES) is not None:
            yield VisionRun(cfg, run, info, None, json.loads((run.out / "report.json").read_text(encoding="utf-8")))
            return
        precision, note = resolve_precision(cfg.precision, info.device)
        if note and cfg.progress:
            print(f"qkv pretrain --objective {kind}: {note}", flush=True)
        sha256 = fingerprint()
        if run.resume:
            check_resume_data(run, cfg, sha256, what=what, error=ImageDataError)
        else:
            run.create({"kind": kind, "train_config": cfg.to_dict(), "model_config": model_config.to_dict(),
                        "data": summary, "data_sha256": sha256, "precision": precision})
        torch.manual_seed(cfg.seed)
        yield VisionRun(cfg, run, info, precision)
