"""The embedding settings a sentence-transformers folder declares: :func:`read_st_settings`.

qkv runs the pipeline ``Transformer → Pooling → Normalize`` (the last optional) that ``modules.json``
lists, and takes from it (read through :func:`qkv.embeddings.options.folder_defaults`):

* ``pooling``: every mode of ``1_Pooling/config.json``, as sentence-transformers reads it: the
  ``pooling_mode`` key (a mode, or a list concatenated in its order), else the older
  ``pooling_mode_*`` booleans, concatenated in sentence-transformers' fixed order cls, max, mean,
  mean_sqrt_len, weightedmean, lasttoken (none set: mean);
* ``normalize``: whether ``modules.json`` has the ``Normalize`` module;
* ``max_len``: ``sentence_bert_config.json``'s ``max_seq_length``, else (as sentence-transformers
  6 saves it) ``tokenizer_config.json``'s ``model_max_length``; cut to the model's positions.

Anything qkv cannot reproduce is refused with one line naming it, never skipped: another module
(``Dense``, a second ``Transformer``, ``CNN``, …), an unknown pooling key or mode, a pooling width
that is not the model's, a ``Transformer`` that is not the folder itself or not plain feature
extraction, ``do_lower_case`` on a tokenizer that does not lower-case, a default prompt.
``include_prompt: false`` is accepted: qkv adds no prompt, so there is none to leave out. Writing
such a folder is :mod:`qkv.checkpoints.st_folder`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from qkv.checkpoints.io import read_json
from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.pooling import check_pooling

__all__ = ["read_st_settings", "ST_FILES", "MODULES_JSON", "POOLING_DIR", "NORMALIZE_DIR", "BERT_CONFIG",
           "ST_CONFIG", "ST_MODES", "QKV_TO_ST"]

MODULES_JSON = "modules.json"
POOLING_DIR, NORMALIZE_DIR = "1_Pooling", "2_Normalize"
BERT_CONFIG, ST_CONFIG = "sentence_bert_config.json", "config_sentence_transformers.json"
#: The entries a sentence-transformers folder written by qkv consists of, beside the model files.
ST_FILES = frozenset({MODULES_JSON, POOLING_DIR, NORMALIZE_DIR, BERT_CONFIG, ST_CONFIG})
#: Legacy ``pooling_mode_*`` keys in sentence-transformers' concatenation order → qkv modes.
_LEGACY = (("pooling_mode_cls_token", "cls"), ("pooling_mode_max_tokens", "max"),
           ("pooling_mode_mean_tokens", "mean"), ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"),
           ("pooling_mode_weightedmean_tokens", "weightedmean"), ("pooling_mode_lasttoken", "lasttoken"))
#: sentence-transformers' mode names → qkv's.
ST_MODES = {"cls": "cls", "max": "max", "mean": "mean", "mean_sqrt_len_tokens": "mean_sqrt_len",
             "weightedmean": "weightedmean", "lasttoken": "lasttoken"}
QKV_TO_ST = {v: k for k, v in ST_MODES.items()}
_POOLING_KEYS = {"embedding_dimension", "word_embedding_dimension", "pooling_mode", "include_prompt",
                 *(k for k, _ in _LEGACY)}
#: ``sentence_bert_config.json`` keys that do not change the vectors of ``encode(texts)``.
_HARMLESS = {"model_args", "model_kwargs", "config_args", "config_kwargs", "unpad_inputs", "query_length",
             "document_length", "backend", "cache_dir"}
_DEFAULT_MODALITY = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}
_SUPPORTED = "qkv runs Transformer → Pooling → optional Normalize"


def _json(path: Path, kind: type = dict):
    return read_json(path, kind=kind, error=EmbeddingError)


# -- reading ----------------------------------------------------------------------------------------
def read_st_settings(folder: str | os.PathLike) -> dict[str, Any]:
    """The embedding settings a sentence-transformers folder declares (see the module docstring).

    Returns:
        A dict with ``pooling``, ``normalize`` and ``max_len`` where the folder declares them
        (empty for a folder without ``modules.json``, ``1_Pooling`` and ``sentence_bert_config.json``).

    Raises:
        EmbeddingError: a module, pooling option or setting qkv cannot reproduce (named).
    """
    folder = Path(folder)
    out: dict[str, Any] = {}
    pooling_dir = POOLING_DIR if (folder / POOLING_DIR / "config.json").is_file() else None
    st = (folder / MODULES_JSON).is_file()
    if st:
        pooling_dir, out["normalize"] = _read_modules(folder)
        _check_st_config(folder / ST_CONFIG)
    if pooling_dir is not None:
        out["pooling"] = _read_pooling(folder / pooling_dir / "config.json", _model_width(folder))
    seq = _read_bert_config(folder)
    if seq is None and st and (folder / "tokenizer_config.json").is_file():
        seq = _json(folder / "tokenizer_config.json").get("model_max_length")  # sentence-transformers 6
    if isinstance(seq, int) and not isinstance(seq, bool) and seq > 2:
        out["max_len"] = seq
    return out


def _read_modules(folder: Path) -> tuple[str, bool]:
    """``(pooling folder, normalise)`` of ``modules.json``; refuses what qkv cannot run."""
    source = folder / MODULES_JSON
    modules = _json(source, list)
    if not all(isinstance(m, dict) and isinstance(m.get("type"), str) for m in modules):
        raise EmbeddingError(f"{source}: expected a list of modules with a 'type' each")
    modules = sorted(modules, key=lambda m: m.get("idx", 0))
    expected = ("Transformer", "Pooling", "Normalize")
    for i, m in enumerate(modules):
        kind = m["type"].rsplit(".", 1)[-1]
        if i >= len(expected) or kind != expected[i] or not m["type"].startswith("sentence_transformers."):
            chain = " → ".join(x["type"].rsplit(".", 1)[-1] for x in modules)
            raise EmbeddingError(f"{source}: module {i} ({m['type']}) is not one qkv can run ({_SUPPORTED}; "
                                 f"this folder has {chain}); use sentence-transformers for this model")
    if len(modules) < 2:
        raise EmbeddingError(f"{source}: no Pooling module ({_SUPPORTED}); the folder yields token vectors, "
                             "not one vector per text")
    if modules[0].get("path", "") not in ("", "."):
        raise EmbeddingError(f"{source}: the Transformer lives in {modules[0]['path']!r}, not in the folder "
                             "itself; qkv reads the model from the folder's own config.json")
    if len(modules) == 3 and (folder / modules[2].get("path", NORMALIZE_DIR) / "config.json").is_file():
        cfg = _json(folder / modules[2].get("path", NORMALIZE_DIR) / "config.json")
        if cfg.get("module_input_name", "sentence_embedding") != "sentence_embedding":
            raise EmbeddingError(f"{source}: Normalize acts on {cfg['module_input_name']!r}; qkv normalises "
                                 "only the pooled vector (sentence_embedding)")
    return modules[1].get("path") or POOLING_DIR, len(modules) == 3


def _read_pooling(path: Path, width: int | None) -> str:
    """The qkv pooling value of a ``1_Pooling/config.json`` (all modes, concatenation order)."""
    data = _json(path)
    unknown = sorted(set(data) - _POOLING_KEYS)
    if unknown:
        raise EmbeddingError(f"{path}: pooling option {unknown[0]!r} is not one qkv supports (it reads "
                             f"{', '.join(sorted(_POOLING_KEYS))}); use sentence-transformers for this model")
    if "pooling_mode" in data:
        given = data["pooling_mode"]
        given = [given] if isinstance(given, str) else given
        if not isinstance(given, list) or not given or not all(isinstance(m, str) for m in given):
            raise EmbeddingError(f"{path}: pooling_mode must be a mode or a list of modes, got {given!r}")
        bad = [m for m in given if m not in ST_MODES]
        if bad:
            raise EmbeddingError(f"{path}: pooling mode {bad[0]!r} is not one qkv supports; supported: "
                                 f"{', '.join(ST_MODES)}")
        modes = [ST_MODES[m] for m in given]
    else:
        modes = [mode for key, mode in _LEGACY if data.get(key)] or ["mean"]  # none set: mean, as ST does
    if data.get("include_prompt", True) not in (True, False):
        raise EmbeddingError(f"{path}: include_prompt must be true or false, got {data['include_prompt']!r}")
    dim = data.get("embedding_dimension", data.get("word_embedding_dimension"))
    if width is not None and dim is not None and dim != width:
        raise EmbeddingError(f"{path}: the pooling expects {dim}-wide token vectors but the model is {width} "
                             "wide; the folder's parts do not belong together")
    return check_pooling(modes)


def _model_width(folder: Path) -> int | None:
    cfg = folder / "config.json"
    return _json(cfg).get("hidden_size") if cfg.is_file() else None


def _read_bert_config(folder: Path) -> int | None:
    """``max_seq_length`` (or the tokenizer's ``model_max_length``) of ``sentence_bert_config.json``."""
    path = folder / BERT_CONFIG
    if not path.is_file():
        return None
    data = _json(path)
    if data.get("transformer_task", "feature-extraction") != "feature-extraction":
        raise EmbeddingError(f"{path}: transformer_task {data['transformer_task']!r}; qkv reproduces "
                             "'feature-extraction' only")
    if data.get("modality_config", _DEFAULT_MODALITY) != _DEFAULT_MODALITY or \
            data.get("module_output_name", "token_embeddings") != "token_embeddings":
        raise EmbeddingError(f"{path}: the Transformer is not plain text feature extraction (modality_config "
                             "or module_output_name changed); qkv reproduces the last hidden state only")
    tok_args = data.get("processor_kwargs", data.get("tokenizer_args")) or {}
    if not isinstance(tok_args, dict):
        raise EmbeddingError(f"{path}: tokenizer options must be a JSON object, got {tok_args!r}")
    unknown = sorted(set(data) - _HARMLESS - {"transformer_task", "modality_config", "module_output_name",
                                               "max_seq_length", "do_lower_case", "processor_kwargs",
                                               "tokenizer_args"})
    unknown += [f"tokenizer option {k}" for k in sorted(set(tok_args) - {"model_max_length"})]
    if unknown:
        raise EmbeddingError(f"{path}: setting {unknown[0]!r} is not one qkv supports; use "
                             "sentence-transformers for this model")
    if data.get("do_lower_case") and not _tokenizer_lowercases(folder):
        raise EmbeddingError(f"{path}: do_lower_case is true but the tokenizer does not lower-case; qkv does "
                             "not change texts before tokenising (lower-case them yourself, or set it false)")
    seq = data.get("max_seq_length")
    return seq if seq is not None else tok_args.get("model_max_length")


def _tokenizer_lowercases(folder: Path) -> bool:
    path = folder / "tokenizer.json"
    if not path.is_file():
        return False
    norm = _json(path).get("normalizer") or {}
    parts = norm.get("normalizers", [norm]) if norm.get("type") == "Sequence" else [norm]
    return any(p.get("type") == "Lowercase" or (p.get("type") == "BertNormalizer" and p.get("lowercase"))
               for p in parts)


def _check_st_config(path: Path) -> None:
    if not path.is_file():
        return
    data = _json(path)
    if data.get("model_type", "SentenceTransformer") != "SentenceTransformer":
        raise EmbeddingError(f"{path}: model_type {data['model_type']!r}; qkv reproduces SentenceTransformer "
                             "(dense text embedding) folders only")
    if data.get("default_prompt_name"):
        raise EmbeddingError(f"{path}: default_prompt_name {data['default_prompt_name']!r}: "
                             "sentence-transformers prepends that prompt to every text and qkv adds none; "
                             "prepend it yourself and set default_prompt_name to null")


# -- writing ----------------------------------------------------------------------------------------
