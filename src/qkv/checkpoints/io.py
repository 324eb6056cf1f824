"""Model folders in and out: ``load``, ``save``, ``export_hf`` and the tokenizer (``convert``: :mod:`qkv.checkpoints.convert`).

Two folder formats:

* **qkv**: ``qkv.json`` (``{"format": "qkv", "version": 2, "kind": "masked_lm" | "encoder" |
  "sequence_classification" | "token_classification" | "discriminator" | "causal_lm" | "encoder_decoder",
  "config": {…ModelConfig…}}``, plus
  ``"task": {…TaskConfig…}`` for the two task kinds; regression is a ``sequence_classification``
  whose task says so; plus ``"plugins": [{"kind", "name", "module"}]`` when the config uses parts
  registered outside qkv, :func:`qkv.plugins.plugins_needed`) and ``model.safetensors`` with qkv
  tensor names.
* **Hugging Face** (BERT, RoBERTa, DistilBERT, ELECTRA, ModernBERT, GPT-2, Marian, BART, T5, ViT): ``config.json`` with its
  ``model_type`` and ``model.safetensors`` or ``pytorch_model.bin``; the latter is read only with
  ``torch.load(weights_only=True)``, which refuses any pickle that would run code. The family's
  converter in :mod:`qkv.checkpoints.families` maps the names and says what is kept (the encoder, a
  pooler, a masked-LM, discriminator or classifier head, GPT-2's causal LM); a head qkv does not
  support is refused, never dropped. The family is kept in ``ModelConfig.family``, and :func:`export_hf`
  writes the model back as that family.

Either may hold ``tokenizer.json`` and/or ``vocab.txt``; :func:`load` returns the model and that
tokenizer (a :class:`~qkv.data.model_tokenizer.ModelTokenizer`: the ``tokenizers.Tokenizer`` with the
special tokens the folder declares, callable on texts) as a
:class:`Pretrained`, and :func:`save` / :func:`export_hf` write it back. Writes are atomic: files
go to a temporary folder beside the target, which is then renamed into place. A target that is a model folder (only model and tokenizer files) is replaced as a
whole (:func:`qkv._fs.replace_dir`): no file of the old model — an old tokenizer, the other
format's config — survives, and ``convert X X`` leaves X loadable at every moment. A target that
holds more (a run folder) gets the new files renamed over the old ones, config last, and the old
model's files that the new one does not have removed.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from qkv import plugins as plugin_registry
from qkv._fs import write_folder
from qkv.config import ModelConfig
from qkv.data.errors import TokenizerError
from qkv.data.model_tokenizer import read_model_tokenizer
from qkv.data.tokenizer_facade import write_tokenizer
from qkv.checkpoints import families
from qkv.checkpoints.bundled import model_folder
from qkv.errors import CheckpointError
from qkv.models.heads import TaskConfig
from qkv.models.kinds import KINDS, build_kind, kind_of, model_kind

__all__ = ["Pretrained", "load", "save", "export_hf", "unpack", "read_weights", "read_json", "is_model_folder",
           "declared_kind"]

QKV_CONFIG = "qkv.json"
HF_CONFIG = "config.json"
WEIGHTS = "model.safetensors"
HF_PICKLE = "pytorch_model.bin"
#: 2: the nested ModelConfig (1: flat, read and migrated).
FORMAT_VERSION = 2
#: ``qkv.json`` kinds: the model classes :func:`load` builds.
#: The files a model folder consists of (what :func:`save` / :func:`export_hf` may write or replace).
MODEL_FILES = frozenset({QKV_CONFIG, HF_CONFIG, WEIGHTS, HF_PICKLE, "tokenizer.json", "vocab.txt",
                         "tokenizer_config.json", "special_tokens_map.json", "embedding.json"})


class Pretrained(NamedTuple):
    """What :func:`load` returns: ``model, tokenizer = qkv.load(folder)``, or ``qkv.load(folder).model``.

    Attributes:
        model: the model (see :func:`load`), in eval mode, with its ``.config``.
        tokenizer: the folder's tokenizer (a :class:`~qkv.data.model_tokenizer.ModelTokenizer`: the
            ``tokenizers.Tokenizer`` API, its special tokens by role, ``tokenizer(texts)`` → padded
            tensors and the mask), or ``None`` when the folder has none.
    """

    model: nn.Module
    tokenizer: Any = None


def unpack(model, tokenizer=None) -> Pretrained:
    """A :class:`Pretrained` from a :class:`Pretrained` or a bare model; a given ``tokenizer``
    replaces the bundle's (a bare model has none unless it is given)."""
    if isinstance(model, Pretrained):
        return Pretrained(model.model, tokenizer if tokenizer is not None else model.tokenizer)
    return Pretrained(model, tokenizer)


def read_weights(path: str | os.PathLike) -> dict[str, Tensor]:
    """Tensors of a ``.safetensors`` file, or of a PyTorch pickle read with ``weights_only=True``.

    Raises:
        CheckpointError: unreadable file, or a pickle that would execute code (refused).
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        try:
            return load_file(path)
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, EOFError) as e:
        raise CheckpointError(
            f"{path}: refused — not a plain tensor checkpoint; loading it would need to run code "
            f"from the pickle, which qkv never does (torch.load(weights_only=True) said: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__})") from e
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, Tensor)
                                             for k, v in data.items()):
        raise CheckpointError(f"{path}: expected a dict of name → tensor, found {type(data).__name__}")
    return data


def declared_kind(path: str | os.PathLike) -> str | None:
    """What a model folder says it holds, from its config file alone (nothing is loaded): ``qkv.json``'s
    ``kind``, else a Hugging Face ``config.json``'s ``model_type``; ``None`` when neither is readable."""
    for name, key in (("qkv.json", "kind"), ("config.json", "model_type")):
        try:
            meta = json.loads((Path(path) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        return meta.get(key) if isinstance(meta, dict) else None
    return None


def read_json(path: Path, *, kind: type = dict, error: type[Exception] = CheckpointError):
    """A model folder's JSON file, which must hold a ``kind`` (a JSON object by default); anything
    else raises ``error`` in one line naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise error(f"{path}: not readable JSON ({e})") from e
    if not isinstance(data, kind):
        what = "object" if kind is dict else kind.__name__
        raise error(f"{path}: expected a JSON {what}, found {type(data).__name__}")
    return data


def _check_state(state: dict[str, Tensor], model: nn.Module, source: Path) -> None:
    expected = model.state_dict()
    for name, t in expected.items():
        if name not in state:
            raise CheckpointError(f"{source}: missing tensor {name!r} (expected shape {tuple(t.shape)})")
        if tuple(state[name].shape) != tuple(t.shape):
            raise CheckpointError(f"{source}: tensor {name!r} has shape {tuple(state[name].shape)}, "
                                  f"expected {tuple(t.shape)} from {QKV_CONFIG}")
    extra = sorted(set(state) - set(expected))
    if extra:
        raise CheckpointError(f"{source}: unexpected tensor(s) {extra[:5]} for the config in {QKV_CONFIG}; "
                              "the config disagrees with the weights")


_kind = kind_of


def load(path: str | os.PathLike, *, plugins: list[str] | tuple[str, ...] = (),
         **overrides: Any) -> Pretrained:
    """Load a qkv model folder or a Hugging Face BERT, RoBERTa, DistilBERT, ELECTRA, ModernBERT, GPT-2 or ViT
    folder: ``model, tokenizer = qkv.load(path)``.

    Args:
        path: the folder, or the short name of a model installed as a package (``"minilm"``:
            all-MiniLM-L6-v2, :mod:`qkv.checkpoints.bundled`).
        plugins: plugin modules to import first (:func:`qkv.plugins.import_plugins`), for a model that
            uses parts registered outside qkv; the installed entry-point plugins load anyway.
        **overrides: :class:`ModelConfig` fields to change (e.g. ``attention_dropout=0.0`` for
            fast fine-tuning; BERT checkpoints carry 0.1, which forces the slow attention path
            while training); not ``pooler``, which the checkpoint decides.

    Returns:
        A :class:`Pretrained` ``(model, tokenizer)``. ``model``: a
        :class:`qkv.models.task_models.SequenceClassifier` (sequence classification, regression) or
        :class:`qkv.models.task_models.TokenClassifier` when the checkpoint has a task head (its
        ``.task`` a :class:`~qkv.models.heads.TaskConfig`), a :class:`qkv.models.mlm.MaskedLM`
        when it has a masked-LM head, a :class:`qkv.models.discriminator.Discriminator` for
        ELECTRA's discriminator, a :class:`qkv.models.causal_lm.CausalLM` for a causal LM (GPT-2),
        an image model (:mod:`qkv.models.vision`: ``ImageClassifier``, ``ImageCaptioner``, or a
        ``VisionEncoder`` — ViT's ``ViTModel``), else a :class:`qkv.nn.encoder.Encoder`; in eval mode, with
        ``.config``. ``tokenizer``: the folder's :class:`~qkv.data.model_tokenizer.ModelTokenizer`
        (``tokenizers.Tokenizer``'s methods, special tokens by role, callable), ``None`` when it has none.

    Raises:
        CheckpointError: not a checkpoint folder; missing, mis-shaped, unexpected or unknown
            tensors; a head qkv does not support; a config that disagrees with the weights; a
            pickle that would run code; a part of a plugin that is not loaded (naming its module).
        PluginError: a module of ``plugins`` that could not be imported.
    """
    if "pooler" in overrides:
        raise ValueError("pooler cannot be overridden: it says whether the checkpoint holds a pooler; "
                         "attach_task_head adds one where a task needs it")
    plugin_registry.load_plugins()
    plugin_registry.import_plugins(plugins)
    folder = model_folder(path)
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist (not a folder)"
        raise CheckpointError(f"{folder}: {what}; give the folder of a qkv, Hugging Face or sentence-transformers "
                              "model")
    if (folder / QKV_CONFIG).is_file():
        meta = read_json(folder / QKV_CONFIG)
        if meta.get("format") != "qkv" or meta.get("kind") not in KINDS:
            raise CheckpointError(f"{folder / QKV_CONFIG}: expected format 'qkv' and kind one of "
                                  f"{', '.join(KINDS)}; found {meta.get('format')!r} / {meta.get('kind')!r}")
        try:  # before the config: its message names the plugin module to load
            plugin_registry.check_recorded(meta.get("plugins", []), str(folder / QKV_CONFIG))
        except plugin_registry.PluginError as e:
            raise CheckpointError(str(e)) from None
        if meta.get("version", 1) not in (1, FORMAT_VERSION):
            raise CheckpointError(f"{folder / QKV_CONFIG}: format version {meta.get('version')!r} is newer than this "
                                  f"qkv reads ({FORMAT_VERSION}); upgrade qkv")
        try:  # version 1 holds the flat config: ModelConfig.from_dict migrates it
            config = ModelConfig.from_dict(meta.get("config", {}))
            config = config.replace(**overrides) if overrides else config
            families.check_family(config)
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"{folder / QKV_CONFIG}: {e}") from e
        kind, task = meta["kind"], None
        if meta["kind"] in ("sequence_classification", "token_classification", "image_classification"):
            try:
                task = TaskConfig.from_dict(meta.get("task"))
            except (ValueError, TypeError) as e:
                raise CheckpointError(f"{folder / QKV_CONFIG}: task: {e}") from e
            if meta["kind"] != "image_classification" and _kind(False, task) != meta["kind"]:
                raise CheckpointError(f"{folder / QKV_CONFIG}: kind {meta['kind']!r} disagrees with task "
                                      f"{task.task!r}")
        source = folder / WEIGHTS
        if not source.is_file():
            raise CheckpointError(f"{folder}: missing {WEIGHTS}")
        state = read_weights(source)
        model = build_kind(config, kind, task)
        _check_state(state, model, source)
    elif (folder / HF_CONFIG).is_file():
        hf_config = read_json(folder / HF_CONFIG)
        family = families.for_checkpoint(hf_config, str(folder / HF_CONFIG))
        source = next((folder / n for n in (WEIGHTS, HF_PICKLE) if (folder / n).is_file()), None)
        if source is None:
            raise CheckpointError(f"{folder}: no weights; expected {WEIGHTS} or {HF_PICKLE}, found "
                                  f"{sorted(p.name for p in folder.iterdir())}")
        config, kind, task, state = family.read(hf_config, read_weights(source), weights_source=str(source),
                                                config_source=str(folder / HF_CONFIG))
        if overrides:
            config = config.replace(**overrides)
        model = build_kind(config, kind, task)
    else:
        raise CheckpointError(f"{folder}: not a qkv or BERT checkpoint folder; expected {QKV_CONFIG} or "
                              f"{HF_CONFIG}, found {sorted(p.name for p in folder.iterdir())}")
    model.load_state_dict(state, strict=True)
    try:
        tokenizer = read_model_tokenizer(folder)
    except TokenizerError as e:
        raise CheckpointError(str(e)) from None
    if tokenizer is not None and tokenizer.get_vocab_size() > config.vocab_size:
        raise CheckpointError(f"{folder}: the tokenizer has {tokenizer.get_vocab_size()} tokens but the "
                              f"model's vocabulary only {config.vocab_size}; ids beyond it cannot be embedded. "
                              "Put the tokenizer the model was trained with into the folder")
    return Pretrained(model.eval(), tokenizer)


def is_model_folder(folder: Path) -> bool:
    """True when ``folder`` holds only model files (:data:`MODEL_FILES`) and hidden entries."""
    return all(p.name in MODEL_FILES or p.name.startswith(".") for p in Path(folder).iterdir())


def _write_folder(dest: Path, config_name: str, fill) -> None:
    """Fill a temp folder beside ``dest`` and publish it there (see the module docstring)."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise CheckpointError(f"{dest}: exists and is not a folder; choose another destination")
    if not dest.exists() or is_model_folder(dest):
        publish = {"how": "replace"}
    else:  # config last: a reader sees old or new, never half; the old model's other files go
        publish = {"how": "merge", "last": config_name, "owned": MODEL_FILES, "fault": "finalise.model"}
    with write_folder(dest, **publish) as tmp:
        fill(tmp)


def save(model: nn.Module | Pretrained, path: str | os.PathLike, *, tokenizer=None) -> Path:
    """Write a qkv folder: ``qkv.json``, ``model.safetensors`` and the tokenizer. Atomic. ``qkv.json``
    names the plugin modules that registered parts the config uses (docs/plugins.md).

    Args:
        model: a qkv model, or a :class:`Pretrained` (its tokenizer is written too).
        path: the folder.
        tokenizer: the tokenizer to write (a ``tokenizers.Tokenizer`` or a qkv
            :class:`~qkv.data.tokenizer.WordPieceTokenizer`; default: the bundle's; none for a
            bare model).

    Returns:
        The folder.
    """
    model, tokenizer = unpack(model, tokenizer)
    config, kind, task = model_kind(model)
    meta = {"format": "qkv", "version": FORMAT_VERSION, "kind": kind,
            "config": config.to_dict()}
    if task is not None:
        meta["task"] = task.to_dict()
    needed = plugin_registry.plugins_needed(config)
    if needed:  # the modules to load before this folder can be: named when they are not
        meta["plugins"] = needed

    def fill(tmp: Path) -> None:
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt"})
        write_tokenizer(tokenizer, tmp, max_len=config.max_len)
        (tmp / QKV_CONFIG).write_text(json.dumps(meta, indent=2), encoding="utf-8")

    _write_folder(Path(path), QKV_CONFIG, fill)
    return Path(path)


def export_hf(model: nn.Module | Pretrained, path: str | os.PathLike, *, tokenizer=None,
              family: str | None = None) -> Path:
    """Write a folder that ``transformers`` ``from_pretrained`` loads, as the model's family
    (``model.config.family``: the one it was imported from; BERT for a qkv model; ``family``
    overrides). BERT: ``BertForMaskedLM`` (masked-LM model), ``BertForSequenceClassification``
    (sequence classification, regression; ``AutoModelForSequenceClassification``),
    ``BertForTokenClassification`` or ``BertModel`` (encoder), the pooler's weights too when the
    model has one; the other families as :mod:`qkv.checkpoints.families` says (e.g.
    ``ElectraForPreTraining`` for a discriminator, ``GPT2LMHeadModel`` for a causal LM,
    ``MarianMTModel``, ``BartForConditionalGeneration`` or ``T5ForConditionalGeneration`` for an
    encoder–decoder, Marian by default). Atomic.
    Returns the folder. ``model`` and ``tokenizer`` as in :func:`save`.

    Raises:
        CheckpointError: the model uses options the family cannot express (every one named in the
            message), e.g. a sequence head that pools with ``"cls"`` or ``"mean"``, RMSNorm or a
            gated feed-forward: keep it in the qkv format.
    """
    model, tokenizer = unpack(model, tokenizer)
    config, kind, task = model_kind(model)
    if kind == "image_captioning":
        raise CheckpointError(f"kind {kind!r} has no Hugging Face family here (the families are encoders, GPT-2, ViT and "
                              "Marian, BART, T5); keep it in the qkv format (qkv convert --to qkv; qkv.save in "
                              "Python)")
    converter = families.for_export(config, family, kind)
    converter.config_to_hf(config, kind, task)  # raises before anything is written

    def fill(tmp: Path) -> None:
        hf_config, tensors = converter.write(model.state_dict(), config, kind, task)
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        write_tokenizer(tokenizer, tmp, max_len=config.max_len)
        (tmp / HF_CONFIG).write_text(json.dumps(hf_config, indent=2), encoding="utf-8")

    _write_folder(Path(path), HF_CONFIG, fill)
    return Path(path)
