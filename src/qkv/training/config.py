"""The pretraining configuration: one frozen, JSON-serialisable dataclass."""

from __future__ import annotations

import abc
import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from qkv.config import ModelConfig
from qkv.models.parts import check_parts
from qkv.training.distributed import STRATEGIES
from qkv.training.loop_fields import check_loop_values
from qkv.training.optim import SCHEDULES
from qkv.training.precision import PRECISIONS
from qkv.validation import (check_batch_tokens, check_choice, check_field_types, check_int, check_positive,
                            check_range, check_run_length, is_int)
from qkv.data.masking import MaskingConfig

__all__ = ["LoopConfig", "RunConfig", "TrainConfig", "OBJECTIVES", "RESUME_MAY_CHANGE", "model_config_for", "read_config_file",
           "parse_json_object"]

#: Fields that may differ between a run and its resumption (they do not change the numbers).
RESUME_MAY_CHANGE = ("device", "progress", "log_every", "threads")


@dataclass(frozen=True)
class LoopConfig:
    """The settings of the training loop (:func:`qkv.training.engine.run_training`), validated.

    Attributes:
        steps: optimiser steps; ``None`` with a ``time_budget``.
        time_budget: minutes of training instead of ``steps`` (the learning rate reaches zero at the
            deadline, :mod:`qkv.training.budget`).
        grad_accum: micro-batches per optimiser step.
        lr, weight_decay, betas, eps: AdamW (weight decay on matrices only,
            :func:`qkv.training.optim.build_optimizer`). position_lr_scale: its position-table group.
        warmup_steps, schedule: linear warm-up, then ``linear``, ``cosine`` or ``constant``.
        clip_norm: gradient-norm clip; ``None``: none (the norm is still measured).
        seed: seeds dropout per (step, micro-batch, rank).
        eval_every, save_every: steps between held-out evaluations / checkpoints (and at the end);
            ``None``: only at the end.
        log_every: steps between logged records (and the last step).
        threads: intra-op CPU threads (``None``: torch's; ``"adaptive"``: time-budgeted runs).
        progress: a progress bar.
        strategy: how a torchrun world shares the model (:mod:`qkv.training.strategy`): ``ddp``
            (a whole copy in every process) or ``fsdp`` (sharded: FSDP2, sharded checkpoints).
    """

    steps: int | None = None
    time_budget: float | None = None
    grad_accum: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    position_lr_scale: float = 1.0
    warmup_steps: int = 0
    schedule: str = "linear"
    clip_norm: float | None = 1.0
    seed: int = 0
    eval_every: int | None = None
    save_every: int | None = None
    log_every: int = 10
    threads: int | str | None = None
    progress: bool = False
    strategy: str = "ddp"

    def __post_init__(self) -> None:
        check_choice("strategy", self.strategy, STRATEGIES)
        if self.steps is None and self.time_budget is None:
            raise ValueError("the loop needs steps or a time_budget")
        check_int("steps", self.steps, low=1, optional=True)
        check_positive("time_budget", self.time_budget, unit=" of minutes (e.g. 10)", optional=True)
        for name in ("grad_accum", "log_every"):
            check_int(name, getattr(self, name), low=1)
        for name in ("eval_every", "save_every"):
            check_int(name, getattr(self, name), low=1, optional=True)
        check_int("warmup_steps", self.warmup_steps, low=0)
        check_run_length(self)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_positive("lr", self.lr)
        check_positive("clip_norm", self.clip_norm, optional=True)
        check_range("weight_decay", self.weight_decay, 0, number=True)
        if not (len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas)):
            raise ValueError(f"betas={self.betas!r} must be two numbers in [0, 1)")

    @classmethod
    def of(cls, cfg: Any, **changes: Any) -> LoopConfig:
        """The loop settings a run configuration holds (its fields of these names), with ``changes``."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{n: getattr(cfg, n) for n in names if hasattr(cfg, n)}, **changes})


class RunConfig(abc.ABC):
    """What the run configurations (:class:`TrainConfig`, ``qkv.finetune.FinetuneConfig``) share:
    copies with changes, the field-by-field difference ``--resume`` checks, JSON, and the check of a
    dict's keys. Subclasses are frozen dataclasses with ``to_dict`` and :meth:`tokens_per_example`
    (abstract: a subclass without it cannot be instantiated)."""

    def replace(self, **changes: Any):
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def diff(self, other, *, ignore: tuple[str, ...] = RESUME_MAY_CHANGE) -> list[str]:
        """Lines ``field: this → other`` for every field that differs (except ``ignore``)."""
        a, b = self.to_dict(), other.to_dict()
        return [f"{k}: {a[k]!r} → {b[k]!r}" for k in a if k not in ignore and a[k] != b[k]]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        """A config from a dict of its fields (unknown keys refused); subclasses convert lists."""
        cls.check_keys(data)
        return cls(**data)

    #: What :meth:`tokens_per_example` counts, in messages.
    EXAMPLE_TOKENS = "max_len"

    @abc.abstractmethod
    def tokens_per_example(self, model: ModelConfig | None = None) -> int | None:
        """The tokens one training example is to the model (``None``: not known before the model is
        read); each run configuration states its own. ``model``: the run's model, when it is known."""

    def check_batch_size(self, tokens_per_example: int | None) -> None:
        """``ValueError`` when ``batch_size`` or ``eval_batch_size`` examples of ``tokens_per_example``
        tokens are above the largest batch (:data:`qkv.validation.MAX_BATCH_TOKENS`)."""
        for name in ("batch_size", "eval_batch_size"):
            check_batch_tokens(name, getattr(self, name), tokens_per_example, length_name=self.EXAMPLE_TOKENS)

    def check_loop_fields(self) -> None:
        """``ValueError`` for a bad ``precision``, ``device`` or ``threads`` (``adaptive`` needs a
        ``time_budget``), or a run too long or a batch too large to start (the upper limits of
        :mod:`qkv.validation`; a batch in :meth:`tokens_per_example`) — the fields of the shared
        training loop."""
        check_run_length(self)
        self.check_batch_size(self.tokens_per_example())
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("device", self.device, ("auto", "cpu", "cuda"))
        check_choice("strategy", getattr(self, "strategy", "ddp"), STRATEGIES)  # (runs without the field: ddp)
        if self.threads is not None:
            t = self.threads
            if t != "adaptive" and (not is_int(t) or t < 1):
                raise ValueError(f"threads={t!r} must be a number ≥ 1 or 'adaptive'")
            if t == "adaptive" and self.time_budget is None:
                raise ValueError("threads='adaptive' needs a time_budget: a step-count run stays "
                                 "bit-reproducible only with a fixed thread count")

    @classmethod
    def check_keys(cls, data: dict[str, Any]) -> None:
        """``ValueError`` naming the unknown keys of ``data`` and the allowed ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; allowed: {', '.join(sorted(names))}")


@dataclass(frozen=True)
class TrainConfig(RunConfig):
    """Everything a pretraining run depends on.

    Attributes:
        corpus: training corpus specs (files, folders, ``dataset:NAME[:SPLIT]``).
        objective: ``"mlm"`` (masked-LM, an encoder) or ``"clm"`` (next-token prediction, a causal
            LM; the masking fields and ``unigram_bias`` are masked-LM options and must keep their
            defaults).
        out: the run folder.
        preset: model preset (``tiny``, ``cpu-small``, ``mini``, ``small``, ``base``).
        model: overrides of the preset's :class:`qkv.config.ModelConfig` fields.
        eval_corpus: held-out corpus specs; default the named test split, else ``eval_fraction``.
        eval_fraction: share of documents held out when no split is named.
        tokenizer: folder or file of an existing tokenizer; ``None`` trains a WordPiece one.
        vocab_size, lowercase: for a trained tokenizer.
        max_len: block length in tokens, ``[CLS]``/``[SEP]`` included.
        doc_sep, text_field, encoding_errors, max_doc_bytes, long_docs: how corpus files are read
            (see ``docs/data.md``).
        steps: optimiser steps (not used when ``time_budget`` is set).
        time_budget: train for this many minutes of wall-clock time instead of ``steps``: the
            learning rate decays with elapsed time and reaches zero at the deadline (see
            :mod:`qkv.training.budget`). ``None``: a step-count run.
        batch_size: blocks per process per micro-batch.
        grad_accum: micro-batches per optimiser step.
        lr, weight_decay, warmup_steps, schedule, clip_norm: optimisation.
        position_lr_scale: learning-rate multiplier of learned position-bias tables (``relative``,
            ``relative-alibi``, ``t5``), which then also get no weight decay; 1 = like every weight.
        select_rate, mask_rate, random_rate, whole_word: masking.
        unigram_bias: start the output bias at the log unigram frequencies of the training tokens,
            so that training starts from the best context-free prediction instead of spending its
            first hundreds of steps learning token frequencies.
        eval_every: evaluate every N steps (and at the end); eval_batches caps the held-out batches.
        save_every: checkpoint every N steps (and at the end).
        seed: seeds the initial weights, the data order, the masks and dropout.
        device: ``auto``, ``cpu`` or ``cuda``.
        precision: ``fp32``, ``bf16`` (mixed precision, float32 master weights; falls back to fp32
            with a message where the processor has no native bf16) or ``auto`` (bf16 where native).
        threads: intra-op CPU threads: ``None`` (torch's default), a number, or ``"adaptive"`` (time-
            budgeted runs only: measure step times and switch between the most threads and one as
            the machine's load changes; see :mod:`qkv.training.threads`).
        strategy: under torchrun, ``ddp`` (every process holds the whole model) or ``fsdp`` (the
            weights, gradients and optimiser state sharded over the processes, FSDP2; sharded
            checkpoints that resume on any number of processes). See ``docs/scaling.md``.
        init_from: start from the weights of this model folder (a qkv run or model folder, or a
            Hugging Face BERT folder) and use its tokenizer, instead of a new model and tokenizer.
            ``preset`` is then not used; ``model`` may still override settings that do not change
            the weights' shapes (e.g. ``dropout``). A folder without a masked-LM head gets a new one
            tied to its word embeddings.
    """

    corpus: tuple[str, ...]
    out: str
    objective: str = "mlm"
    preset: str = "mini"
    model: dict[str, Any] = field(default_factory=dict)
    eval_corpus: tuple[str, ...] | None = None
    eval_fraction: float = 0.05
    tokenizer: str | None = None
    vocab_size: int = 8192
    lowercase: bool = True
    max_len: int = 128
    doc_sep: str = "line"
    text_field: str = "text"
    encoding_errors: str = "strict"
    max_doc_bytes: int = 4 * 1024 * 1024
    long_docs: str = "error"
    steps: int = 1000
    time_budget: float | None = None
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 100
    schedule: str = "linear"
    clip_norm: float = 1.0
    position_lr_scale: float = 1.0
    select_rate: float = 0.15
    mask_rate: float = 0.8
    random_rate: float = 0.1
    whole_word: bool = False
    unigram_bias: bool = True
    eval_every: int = 200
    eval_batches: int = 20
    eval_batch_size: int = 64
    save_every: int = 200
    seed: int = 0
    device: str = "auto"
    precision: str = "fp32"
    threads: int | str | None = None
    strategy: str = "ddp"
    init_from: str | None = None
    progress: bool = True
    log_every: int = 10

    def __post_init__(self) -> None:
        check_field_types(self)
        if isinstance(self.corpus, str):
            object.__setattr__(self, "corpus", (self.corpus,))
        object.__setattr__(self, "corpus", tuple(str(c) for c in self.corpus))
        if self.eval_corpus is not None:
            ev = (self.eval_corpus,) if isinstance(self.eval_corpus, str) else self.eval_corpus
            object.__setattr__(self, "eval_corpus", tuple(str(c) for c in ev))
        object.__setattr__(self, "out", str(self.out))
        if not self.corpus:
            raise ValueError("corpus is empty: give at least one file, folder or dataset:NAME")
        check_loop_values(self)
        for name in ("eval_batches", "eval_batch_size", "vocab_size"):
            check_int(name, getattr(self, name), low=1)
        check_int("max_len", self.max_len, low=3)
        if self.vocab_size > MAX_VOCAB_SIZE:  # the tokenizer trainer aborts the process on absurd sizes
            raise ValueError(f"vocab_size={self.vocab_size:,} is above {MAX_VOCAB_SIZE:,} (the largest vocabularies "
                             "in use hold about 256,000 tokens); choose a smaller --vocab-size")
        check_range("position_lr_scale", self.position_lr_scale, 0, bounds="(")
        check_range("eval_fraction", self.eval_fraction, 0, 1, bounds="()")
        self.check_loop_fields()
        if self.init_from is not None:
            if not isinstance(self.init_from, str) or not self.init_from:
                raise ValueError(f"init_from={self.init_from!r} must be the path of a model folder")
            if self.tokenizer is not None:
                raise ValueError("init_from and tokenizer are both set: a run started from a model uses "
                                 "that model's tokenizer; drop --tokenizer")
        if not isinstance(self.model, dict):
            raise ValueError(f"model overrides must be a dict of ModelConfig fields, got {self.model!r}")
        _check_masking(self)
        check_choice("objective", self.objective, OBJECTIVES)
        if self.objective == "clm":
            _check_clm(self)

    def tokens_per_example(self, model: ModelConfig | None = None) -> int:
        """A block's tokens: ``max_len``."""
        return self.max_len

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["corpus"] = list(self.corpus)
        out["eval_corpus"] = list(self.eval_corpus) if self.eval_corpus is not None else None
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        cls.check_keys(data)
        data = dict(data)
        if "corpus" not in data:
            raise ValueError("corpus is required (a file, a folder or dataset:NAME[:SPLIT])")
        for name in ("corpus", "eval_corpus"):  # a single spec may be given as a string
            if isinstance(data.get(name), (str, os.PathLike)):
                data[name] = (data[name],)
            elif isinstance(data.get(name), (list, tuple)):
                data[name] = tuple(data[name])
        return cls(**data)


#: The largest vocabulary a trained tokenizer may have.
MAX_VOCAB_SIZE = 1_000_000


def model_config_for(cfg: TrainConfig, vocab_size: int | None = None, *, hint: str = "") -> ModelConfig:
    """The ModelConfig a run of ``cfg`` builds from its preset: ``cfg.preset`` with the ``cfg.model``
    overrides and the tokenizer's vocabulary size (an ``init_from`` run loads its model instead).

    Args:
        cfg: the run's configuration.
        vocab_size: the tokenizer's vocabulary size; ``None``: the preset's (or the overrides').
        hint: appended to the message of a ``max_len`` beyond the position table (how to fix it;
            default: the ``--max-len`` that fits, or a preset with a longer table).

    Raises:
        ValueError: the overrides name another ``vocab_size`` than the tokenizer's, a field is bad
            (the message of :class:`~qkv.config.ModelConfig`), or ``cfg.max_len`` exceeds the model's
            position table.
    """
    overrides = dict(cfg.model)
    if vocab_size is not None:
        overrides.setdefault("vocab_size", vocab_size)
        if overrides["vocab_size"] != vocab_size:
            raise ValueError(f"model vocab_size={overrides['vocab_size']} differs from the tokenizer's "
                             f"{vocab_size}")
    mc = check_parts(ModelConfig.preset(cfg.preset, **overrides))
    if mc.max_len < cfg.max_len:
        hint = hint or (f"; pass --max-len {mc.max_len} (or less), or a preset with a longer table "
                        f"(--preset cpu-small: 512)")
        raise ValueError(f"max_len={cfg.max_len} exceeds the model's position table ({mc.max_len}){hint}")
    return mc


def _check_masking(cfg) -> None:
    check_range("select_rate", cfg.select_rate, 0, 1, bounds="(]",
                tail=": it is the share of tokens the model learns to predict (--select-rate, default 0.15)")
    MaskingConfig(cfg.select_rate, cfg.mask_rate, cfg.random_rate, cfg.whole_word)


#: What a pretraining run learns: masked-LM (an encoder) or causal-LM (a decoder).
OBJECTIVES = ("mlm", "clm")
_MLM_ONLY = {"select_rate": "--select-rate", "mask_rate": "--mask-rate", "random_rate": "--random-rate",
             "whole_word": "--whole-word", "unigram_bias": "--no-unigram-bias"}


def _check_clm(cfg) -> None:
    """The masked-LM options keep their defaults under ``objective="clm"`` (nothing is masked, and
    the causal LM's tied head has no output bias to start at the unigram frequencies)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    changed = [flag for name, flag in _MLM_ONLY.items() if getattr(cfg, name) != defaults[name]]
    if changed:
        raise ValueError(f"{', '.join(changed)}: masked-LM option(s), not used by objective='clm' (no token is "
                         "masked; the causal LM's head has no output bias); drop them or use --objective mlm")


def parse_json_object(text: str, what: str) -> dict[str, Any]:
    """``text`` parsed as a JSON object; ``ValueError`` naming ``what`` otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what}: expected a JSON object {{…}}, found {type(data).__name__}")
    return data


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON object of a ``--config`` file.

    Raises:
        ValueError: a missing or unreadable file, invalid JSON, or not an object (names the file).
    """
    try:
        text = open(path, encoding="utf-8").read()
    except FileNotFoundError:
        raise ValueError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--config {path}: cannot read it ({e})") from None
    return parse_json_object(text, f"--config {path}")
