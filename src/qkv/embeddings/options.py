"""The embedding options: one frozen, validated :class:`EmbedOptions` shared by :func:`qkv.embed`,
:class:`~qkv.embeddings.embedder.Embedder`, indexing, evaluation and the command line.

An option is checked in two places:

* on construction (:meth:`EmbedOptions.__post_init__`, so also by :meth:`~EmbedOptions.replace` and
  :meth:`~EmbedOptions.from_dict`): everything that does not depend on the model: the allowed
  values of ``pooling`` (stored in its ``"+"``-joined form) and ``empty``, types, ``max_len ≥ 3``,
  ``stride`` within the window when both are given, the device name;
* against the model (:meth:`EmbedOptions.resolved`, called by the embedder once the model is
  loaded): ``layers`` within the model's layers, ``max_len`` within its position table, ``stride``
  within the window that results.

``pooling``, ``layers``, ``normalize``, ``max_len`` and ``stride`` may be left unset (``None``): they then
come from the model folder's declared defaults (:func:`folder_defaults`, applied by
:meth:`EmbedOptions.with_folder_defaults`: a field set explicitly always wins), else from the model
(:meth:`EmbedOptions.resolved`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qkv.checkpoints.st_settings import read_st_settings
from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.pooling import check_pooling, normalize_layers
from qkv.errors import check_device
from qkv.nn.maps import PRECISIONS
from qkv.validation import check_choice, check_int

__all__ = ["EmbedOptions", "as_options", "EMPTY_MODES", "EMBEDDING_JSON", "VECTOR_FIELDS", "CHUNK_DOCS",
           "folder_defaults"]

EMPTY_MODES = ("error", "zero", "skip")
#: Written by ``qkv train-embeddings`` next to the weights: the pooling the model was trained for.
EMBEDDING_JSON = "embedding.json"
#: Documents per length-grouped chunk of a stream (the default ``chunk_size``).
CHUNK_DOCS = 4096
#: The fields that decide the vectors themselves (the others decide how they are computed): what an
#: index folder's ``index.json`` and an evaluation result record, resolved (see
#: :meth:`EmbedOptions.resolved`).
VECTOR_FIELDS = ("pooling", "layers", "normalize", "max_len", "stride", "truncate")
#: The fields a model folder may declare (see :func:`folder_defaults`).
_FOLDER_FIELDS = ("pooling", "layers", "normalize", "max_len")


@dataclass(frozen=True, kw_only=True)
class EmbedOptions:
    """How documents are embedded; validated on construction (see the module docstring).

    Attributes:
        pooling: a mode of :data:`~qkv.embeddings.pooling.POOLINGS` (``"mean"``, ``"cls"``, ``"max"``,
            ``"mean_sqrt_len"``, ``"weightedmean"``, ``"lasttoken"``; see :mod:`qkv.embeddings.pooling`),
            or several joined with ``"+"`` or given as a tuple (``"cls+mean"`` = ``("cls", "mean")``:
            the vectors concatenated in that order, K·C wide); stored ``"+"``-joined. ``None``: the
            model folder's declared pooling (``embedding.json`` or sentence-transformers'
            ``1_Pooling``), else ``"mean"``.
        layers: one index into the hidden states (``-1`` last, ``0`` the embedding output) or several,
            whose token vectors are averaged before pooling (e.g. ``(-4, -3, -2, -1)``); stored as a
            tuple; ``None``: the folder's, else ``(-1,)``.
        normalize: L2-normalise each document vector; ``None``: what the model folder declares
            (``embedding.json``; a sentence-transformers folder: whether it has the ``Normalize``
            module), else ``True``.
        max_len: window length in tokens including ``[CLS]``/``[SEP]``; ``None``: the folder's
            declared length (e.g. sentence-transformers' ``max_seq_length``, capped at the model's
            limit), else the model's limit.
        stride: text tokens between window starts; ``None``: ¾ of the window's text tokens (windows
            overlap by a quarter).
        truncate: keep only the first window of a long document instead of averaging all its
            windows (counted in :attr:`Embedder.stats <qkv.embeddings.embedder.Embedder>`).
        empty: empty documents: ``"error"``, ``"zero"`` or (streams only) ``"skip"``; see
            :mod:`qkv.embeddings.embedder`.
        batch_size: at most this many windows per forward pass.
        batch_tokens: at most this many tokens per forward pass (``None``: no token limit, batches of
            ``batch_size`` windows): windows are grouped by length and batched by token count, so a
            batch of short documents holds as much work as one of long documents.
        precision: ``"fp32"``, ``"bf16"`` or ``"int8"``: how the encoder runs (see
            :func:`qkv.inference.for_inference` and docs/inference.md for what each costs in accuracy);
            a precision the device does not support natively is refused.
        chunk_size: documents per length-grouped chunk of a stream.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device`` …; ``None`` (or ``"auto"``):
            CUDA when available for a folder, the model's own device for a model object.
        progress: show a progress bar (stderr).

    Raises:
        EmbeddingError: a bad value (one line naming it and the allowed ones).
        QkvError: ``device`` is not a device name torch accepts, or CUDA that is not there.
    """

    pooling: str | tuple[str, ...] | None = None
    layers: int | tuple[int, ...] | None = None
    normalize: bool | None = None
    max_len: int | None = None
    stride: int | None = None
    truncate: bool = False
    empty: str = "error"
    batch_size: int = 256
    batch_tokens: int | None = 4096
    precision: str = "fp32"
    chunk_size: int = CHUNK_DOCS
    device: Any = None
    progress: bool = False

    def __post_init__(self) -> None:
        if self.pooling is not None:
            object.__setattr__(self, "pooling", check_pooling(self.pooling))
        if self.layers is not None:
            object.__setattr__(self, "layers", _check_layers(self.layers))
        for name in ("normalize", "truncate", "progress"):
            value = getattr(self, name)
            if value is None and name == "normalize":
                continue
            check_choice(name, value, (True, False), error=EmbeddingError)  # 0 and 1 pass, stored as bools
            object.__setattr__(self, name, bool(value))
        check_int("batch_size", self.batch_size, 1, error=EmbeddingError)
        check_int("batch_tokens", self.batch_tokens, 1, optional=True, error=EmbeddingError,
                  tail=", or None for batches of batch_size windows")
        check_choice("precision", self.precision, PRECISIONS, error=EmbeddingError)
        check_int("chunk_size", self.chunk_size, 1, error=EmbeddingError)
        check_int("max_len", self.max_len, 3, optional=True, error=EmbeddingError,
                  tail=" (a window needs [CLS], [SEP] and one token), or None for the default")
        check_int("stride", self.stride, 1, optional=True, error=EmbeddingError, tail=", or None for the default")
        if self.max_len is not None and self.stride is not None and self.stride > self.max_len - 2:
            raise _stride_error(self.stride, self.max_len - 2)
        check_choice("empty", self.empty, EMPTY_MODES, error=EmbeddingError)
        check_device(self.device)

    # -- changes ---------------------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The option names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, **changes) -> EmbedOptions:
        """A copy with ``changes`` applied (and validated).

        Raises:
            EmbeddingError: an unknown option name (the message lists the allowed ones) or a bad value.
        """
        _check_names(changes)
        return dataclasses.replace(self, **changes) if changes else self

    def to_dict(self, fields: Iterable[str] | None = None) -> dict[str, Any]:
        """The options as a JSON-ready dict (``layers`` a list, ``device`` a string).

        Args:
            fields: the options to include, in this order (default: all), e.g. :data:`VECTOR_FIELDS`.
        """
        names = self.field_names() if fields is None else tuple(fields)
        _check_names(dict.fromkeys(names))
        out = {name: getattr(self, name) for name in names}
        if out.get("layers") is not None:
            out["layers"] = list(out["layers"])
        if out.get("device") is not None:
            out["device"] = str(out["device"])
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EmbedOptions:
        """Options from a dict written by :meth:`to_dict` (any subset of the fields: the rest keep
        their defaults), such as the ``embedding`` record of an ``index.json``.

        Raises:
            EmbeddingError: not a dict, an unknown key, or a bad value.
        """
        if not isinstance(data, Mapping):
            raise EmbeddingError(f"embedding options must be a JSON object, got {type(data).__name__}")
        _check_names(data)
        return cls(**data)

    # -- defaults --------------------------------------------------------------------------------------
    def with_folder_defaults(self, folder: str | os.PathLike | Mapping[str, Any], *,
                             max_positions: int | None = None) -> EmbedOptions:
        """These options with each unset field (``None``) that the model folder declares filled in.

        Args:
            folder: a model folder, or the dict :func:`folder_defaults` read from one.
            max_positions: the model's position table size: a declared ``max_len`` beyond it is cut
                to it (an explicit ``max_len`` is never cut; :meth:`resolved` checks it).

        Returns:
            The filled-in options; fields set explicitly are kept as they are.

        Raises:
            EmbeddingError: the folder declares a bad value, or its settings are unreadable.
        """
        if not isinstance(folder, Mapping):
            try:
                folder = folder_defaults(folder)
            except (OSError, json.JSONDecodeError) as e:
                raise EmbeddingError(f"{folder}: unreadable embedding settings ({e})") from e
        fill = {k: folder[k] for k in _FOLDER_FIELDS
                if getattr(self, k) is None and folder.get(k) is not None}
        if max_positions is not None and isinstance(fill.get("max_len"), int):
            fill["max_len"] = min(fill["max_len"], max_positions)
        try:
            EmbedOptions(**fill)  # the folder's values alone: a bad one is the folder's fault
        except EmbeddingError as e:
            raise EmbeddingError(f"{e} (declared by the model folder)") from None
        return self.replace(**fill)

    def resolved(self, *, n_layers: int, max_positions: int) -> EmbedOptions:
        """Every unset field at its default for the model, checked against the model.

        Args:
            n_layers: the encoder's number of layers.
            max_positions: its position table size (the longest window).

        Returns:
            Options with ``pooling`` (default ``"mean"``), ``layers`` (default the last; as sorted
            non-negative indices into the hidden states), ``normalize`` (default ``True``),
            ``max_len`` (default ``max_positions``)
            and ``stride`` (default ¾ of the window's text tokens) all set.

        Raises:
            EmbeddingError: a layer out of range, ``max_len`` beyond the position table, ``stride``
                beyond the window.
        """
        layers = normalize_layers(self.layers if self.layers is not None else (-1,), n_layers)
        window = self.max_len if self.max_len is not None else max_positions
        if not 3 <= window <= max_positions:
            raise EmbeddingError(f"max_len={window} must be in [3, {max_positions}] (the model's position "
                                 f"table holds {max_positions}; a window needs [CLS], [SEP] and one token)")
        span = window - 2
        stride = self.stride if self.stride is not None else max(1, (3 * span) // 4)
        if not 1 <= stride <= span:
            raise _stride_error(stride, span)
        normalize = True if self.normalize is None else self.normalize
        return self.replace(pooling=self.pooling or "mean", layers=layers, normalize=normalize,
                            max_len=window, stride=stride)


def as_options(options: EmbedOptions | None = None, /, *, default: EmbedOptions | None = None,
               **changes) -> EmbedOptions:
    """The options of a call that takes ``options=`` and keyword changes (``qkv.embed(m, texts,
    pooling="cls")``).

    Args:
        options: the caller's options; ``None``: ``default``.
        default: the options when none are given (default ``EmbedOptions()``).
        **changes: options to change on top (see :meth:`EmbedOptions.replace`).

    Returns:
        ``options.replace(**changes)``.

    Raises:
        EmbeddingError: ``options`` is not an :class:`EmbedOptions`, an unknown option name (the
            message lists the allowed ones), or a bad value.
    """
    if options is None:
        options = default if default is not None else EmbedOptions()
    elif not isinstance(options, EmbedOptions):
        raise EmbeddingError(f"options must be an EmbedOptions, got {type(options).__name__} (pass the "
                             "options one by one as keywords, or options=EmbedOptions(...))")
    return options.replace(**changes)


def _check_layers(layers) -> tuple[int, ...]:
    if isinstance(layers, int) and not isinstance(layers, bool):
        return (layers,)
    try:
        out = tuple(layers) if not isinstance(layers, (str, bytes)) else None
    except TypeError:
        out = None
    if out is None:
        raise EmbeddingError(f"layers must be an int or a sequence of ints, got {layers!r}")
    if not out:
        raise EmbeddingError("layers is empty; give at least one layer index (e.g. -1 for the last)")
    for i in out:
        if not isinstance(i, int) or isinstance(i, bool):
            raise EmbeddingError(f"layers={layers!r} holds {i!r}, not an int; allowed: layer indices (0 the "
                                 "embedding output, -1 the last layer, -2 the one before …)")
    return out


def _stride_error(stride: int, span: int) -> EmbeddingError:
    return EmbeddingError(f"stride={stride} must be in [1, {span}] (the window holds {span} text tokens; a "
                          "larger stride would skip tokens)")


def _check_names(names: Iterable[str]) -> None:
    allowed = EmbedOptions.field_names()
    for name in names:
        if name not in allowed:
            close = difflib.get_close_matches(str(name), allowed, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise EmbeddingError(f"unknown embedding option {name!r}{hint}; allowed: {', '.join(allowed)}")


def folder_defaults(folder: str | os.PathLike) -> dict[str, Any]:
    """Embedding settings a model folder declares.

    ``embedding.json`` (qkv), else a pretraining run's block length (``run.json``'s
    ``train_config.max_len``: longer windows would reach position embeddings that never trained) or
    the sentence-transformers files (:func:`qkv.checkpoints.st_settings.read_st_settings`: every
    pooling mode of ``1_Pooling/config.json``, the ``Normalize`` module of ``modules.json``,
    ``max_seq_length``; a module or option qkv cannot reproduce is refused).

    Returns:
        A dict with the keys ``pooling``, ``layers``, ``normalize``, ``max_len`` (any may be absent).

    Raises:
        OSError, json.JSONDecodeError: an unreadable settings file.
        EmbeddingError: a sentence-transformers folder qkv cannot reproduce (named).
    """
    folder = Path(folder)
    out: dict[str, Any] = {}
    own = folder / EMBEDDING_JSON
    if own.is_file():
        data = json.loads(own.read_text(encoding="utf-8"))
        out.update({k: data[k] for k in _FOLDER_FIELDS if data.get(k) is not None})
        return out
    run = folder / "run.json"  # a `qkv pretrain` run: positions beyond its block length are untrained
    if run.is_file():
        block = json.loads(run.read_text(encoding="utf-8")).get("train_config", {}).get("max_len")
        if isinstance(block, int) and block > 2:
            out["max_len"] = block
    out.update(read_st_settings(folder))
    return out
