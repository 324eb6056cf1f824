"""The models a server holds, by name, each with its operations and their batching queues.

A model folder is loaded once at start (:func:`qkv.load`); its kind decides what it answers:

======================  =============================================================
kind                    operations (endpoint)
======================  =============================================================
``encoder``             embeddings (``/v1/embeddings``), attention (``/v1/attention``)
``masked_lm``           embeddings, fill-mask (``/v1/fill-mask``), attention
``classifier``          classify (``/v1/classify``), attention
``causal_lm``           completions (``/v1/completions``), attention
``discriminator``,      attention (translation has no endpoint yet: ``/v1/translations``
``encoder_decoder``     answers 404)
======================  =============================================================

Requests name a model by its name only; an unknown name is 404, an operation the model's kind
does not have is 400 naming the kinds that have it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from qkv.errors import QkvError
from qkv.models.causal_lm import CausalLM
from qkv.models.discriminator import Discriminator
from qkv.models.task_models import TaskModel
from qkv.checkpoints.io import load
from qkv.models.mlm import MaskedLM
from qkv.models.seq2seq import EncoderDecoder
from qkv.serve.batching import BatchQueue
from qkv.serve.completions import CompletionsOperation
from qkv.serve.config import ModelSpec, ServeConfig
from qkv.serve.errors import ApiError, ServeError, shown
from qkv.serve.explorer import AttentionOperation, SearchOperation
from qkv.serve.metrics import Metrics
from qkv.serve.operations import ClassifyOperation, EmbedOperation, FillMaskOperation

__all__ = ["Registry", "ServedModel", "OPERATIONS", "ENDPOINTS", "model_kind"]

#: The operations of each kind of model.
OPERATIONS = {
    "encoder": ("embeddings", "attention"),
    "masked_lm": ("embeddings", "fill-mask", "attention"),
    "classifier": ("classify", "attention"),
    "causal_lm": ("completions", "attention"),
    "discriminator": ("attention",),
    "encoder_decoder": ("attention",),
}
#: The endpoint of each operation.
ENDPOINTS = {"embeddings": "/v1/embeddings", "classify": "/v1/classify", "fill-mask": "/v1/fill-mask",
             "completions": "/v1/completions", "attention": "/v1/attention"}
#: Operations that run one request at a time, without waiting for others.
_ALONE = ("completions", "attention")


def model_kind(model) -> str:
    """The kind (a key of :data:`OPERATIONS`) of a model :func:`qkv.load` returned."""
    for cls, kind in ((MaskedLM, "masked_lm"), (TaskModel, "classifier"), (CausalLM, "causal_lm"),
                      (Discriminator, "discriminator"), (EncoderDecoder, "encoder_decoder")):
        if isinstance(model, cls):
            return kind
    return "encoder"


@dataclass
class ServedModel:
    """One model: its name, kind, operations and their queues.

    Attributes:
        unavailable: operations of its kind that it cannot offer, with the reason (e.g. a masked LM
            whose tokenizer has no ``[MASK]``).
        info: what ``/v1/models`` says about it.
    """

    name: str
    kind: str
    operations: dict[str, object] = field(default_factory=dict)
    queues: dict[str, BatchQueue] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    info: dict = field(default_factory=dict)

    def operation(self, op: str):
        """``(operation, queue)`` for ``op``; 400 when this model's kind has no such operation."""
        if op in self.operations:
            return self.operations[op], self.queues[op]
        if op in self.unavailable:
            raise ApiError(400, f"model {self.name!r} cannot answer {ENDPOINTS[op]}: {self.unavailable[op]}",
                           param="model", code="unavailable")
        kinds = [k for k, ops in OPERATIONS.items() if op in ops]
        raise ApiError(400, f"model {self.name!r} is a {self.kind} model: it answers "
                       f"{', '.join(ENDPOINTS[o] for o in self.operations)}; {ENDPOINTS[op]} needs a model of kind "
                       f"{' or '.join(kinds)}", param="model", code="wrong_model_kind")


def _operations(spec: ModelSpec, config: ServeConfig, log: Callable[[str], None]):
    """``(kind, {op: operation}, {op: reason unavailable})`` of one model folder."""
    try:
        pretrained = load(spec.folder)
    except (QkvError, OSError) as e:
        raise ServeError(f"model {spec.name!r}: {e}") from None
    model, tokenizer = pretrained
    kind = model_kind(model)
    if tokenizer is None:
        raise ServeError(f"model {spec.name!r}: {spec.folder} has no tokenizer (tokenizer.json or vocab.txt); a "
                         "served model reads text, so copy the tokenizer it was trained with into the folder")
    makers = {
        "embeddings": lambda: EmbedOperation(pretrained, spec.folder, precision=config.precision,
                                             batch_tokens=config.batch_tokens),
        "classify": lambda: ClassifyOperation(spec.folder, precision=config.precision,
                                              batch_tokens=config.batch_tokens),
        "fill-mask": lambda: FillMaskOperation(model, tokenizer),
        "completions": lambda: CompletionsOperation(model, tokenizer),
        "attention": lambda: AttentionOperation(model, tokenizer),
    }
    ops, unavailable = {}, {}
    for op in OPERATIONS[kind]:
        try:
            ops[op] = makers[op]()
        except QkvError as e:
            if op in ("embeddings", "classify", "completions"):  # what the model is served for
                raise ServeError(f"model {spec.name!r}: {e}") from None
            unavailable[op] = str(e)
            log(f"qkv serve: model {spec.name!r} is served without {ENDPOINTS[op]}: {e}")
    for op in ("embeddings", "classify"):
        if op in ops:
            ops[op].warm_up()
    return kind, ops, unavailable


class Registry:
    """The served models, loaded and ready (their queues started by :meth:`start`).

    Args:
        config: the :class:`~qkv.serve.config.ServeConfig`.
        metrics: where the queues count.
        log: where notes go (default: nowhere).

    Raises:
        ServeError: a model that cannot be loaded or served, an index that cannot be opened.
    """

    def __init__(self, config: ServeConfig, metrics: Metrics, *, log: Callable[[str], None] = lambda m: None):
        self.models: dict[str, ServedModel] = {}
        for spec in config.models:
            kind, ops, unavailable = _operations(spec, config, log)
            served = ServedModel(spec.name, kind, ops, unavailable=unavailable)
            for op, operation in ops.items():
                alone = op in _ALONE
                served.queues[op] = BatchQueue(spec.name, op, operation.run, budget=config.batch_tokens,
                                               max_wait=0.0 if alone else config.max_wait_ms / 1000,
                                               maxsize=config.queue_size, max_items=1 if alone else None,
                                               metrics=metrics)
            served.info = _info(served, config)
            self.models[spec.name] = served
        self.search: tuple[SearchOperation, BatchQueue] | None = None
        if config.index is not None:
            try:
                search = SearchOperation(config.index, precision=config.precision)
            except QkvError as e:
                raise ServeError(f"--index {config.index}: {e}") from None
            self.search = (search, BatchQueue("index", "search", search.run, budget=config.batch_tokens,
                                              max_wait=config.max_wait_ms / 1000, maxsize=config.queue_size,
                                              metrics=metrics))

    def _queues(self) -> list[BatchQueue]:
        queues = [q for m in self.models.values() for q in m.queues.values()]
        return queues + ([self.search[1]] if self.search else [])

    def start(self) -> None:
        for q in self._queues():
            q.start()

    def close(self) -> None:
        """Finish every accepted request, then stop the batching threads."""
        for q in self._queues():
            q.close()

    def get(self, name) -> ServedModel:
        """The model called ``name``; 404 naming the models there are otherwise."""
        if not isinstance(name, str):
            raise ApiError(400, "model must be a string: the name of a served model", param="model",
                           code="invalid_type")
        if name not in self.models:
            raise ApiError(404, f"model {shown(name)} is not served here; the models are {', '.join(self.models)} "
                           "(GET /v1/models lists them)", param="model", code="model_not_found")
        return self.models[name]

    def operation(self, name, op: str):
        """``(model, operation, queue)`` for a request naming model ``name``."""
        model = self.get(name)
        return (model, *model.operation(op))


def _info(served: ServedModel, config: ServeConfig) -> dict:
    info = {"kind": served.kind, "endpoints": [ENDPOINTS[o] for o in served.operations]}
    embed = served.operations.get("embeddings")
    if embed is not None:
        info.update(dimensions=embed.dim, normalized=embed.normalized, max_len=embed.embedder.window,
                    precision=config.precision)
    classify = served.operations.get("classify")
    if classify is not None:
        info.update(task=classify.task, labels=list(classify.labels), precision=config.precision)
    return info
