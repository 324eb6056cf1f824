"""What the family converters share: the tensor plan, its checks, class names, export refusals.

A family module describes a checkpoint as a :class:`Plan`: rows ``(Hugging Face name, qkv name,
symbolic shape)`` copied one to one, and fused rows (qkv's one ``qkv_proj`` from three Hugging Face
maps, rows ``[q; k; v]``; a cross-attention's ``kv_proj`` from two, ``[k; v]``). The same plan
reads (:func:`state_from_plan`, after :func:`check_plan`)
and writes (:func:`tensors_from_plan`). Symbolic shapes are strings of dimension letters resolved
by ``Plan.dims`` (``"VC"`` → ``(V, C)``); ``Plan.fields`` names the ``config.json`` field of each
letter for the messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from qkv.config import ModelConfig, field_path, flat_value
from qkv.errors import CheckpointError
from qkv.models.heads import TaskConfig
from qkv.models.kinds import KINDS, kind_of  # noqa: F401  (the converters name kinds as qkv does)

ACT_FROM_HF = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "silu": "silu", "swish": "silu"}
ACT_TO_HF = {"gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "silu"}
class Imported(NamedTuple):
    """A converted Hugging Face checkpoint: what :mod:`qkv.checkpoints.io` builds and fills."""

    config: ModelConfig
    kind: str
    task: TaskConfig | None
    state: dict[str, Tensor]


@dataclass
class Plan:
    """The tensors of one checkpoint (see the module docstring)."""

    dims: dict[str, int]
    fields: dict[str, str]
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    fused: list[tuple[str, tuple[str, str, str], str]] = field(default_factory=list)

    def shape(self, sym: str) -> tuple[int, ...]:
        return tuple(self.dims[d] for d in sym)

    def expected(self) -> dict[str, str]:
        """Hugging Face name → symbolic shape of every tensor the plan needs."""
        out = {hf: sym for hf, _, sym in self.rows}
        for _, parts, sym in self.fused:
            out.update({hf: sym for hf in parts})
        return out


def check_plan(tensors: dict[str, Tensor], plan: Plan, source: str, *, ignored: tuple[str, ...],
               owned: tuple[str, ...], layers_field: str, n_layers: int, unknown: str,
               pooler: str | None = None) -> None:
    """Every planned tensor present with its shape; any other tensor refused (named).

    Args:
        ignored: prefixes of tensors tolerated and dropped (id buffers, heads the family defines
            as ignorable). owned: prefixes of tensors of the model itself: one not planned means
            the config disagrees with the weights. unknown: what qkv reads, for the refusal of
            any other tensor. pooler: prefix of the pooler's tensors, for its own message.
    """
    expected = plan.expected()
    for name, sym in expected.items():
        want = plan.shape(sym)
        if name not in tensors:
            raise CheckpointError(f"{source}: missing tensor {name!r} (expected shape {want}, "
                                  "from config.json)")
        got = tuple(tensors[name].shape)
        if got != want:
            fields = ", ".join(f"{plan.fields[d]}={plan.dims[d]}" for d in dict.fromkeys(sym))
            raise CheckpointError(f"{source}: tensor {name!r} has shape {got}, expected {want} "
                                  f"from config.json ({fields})")
    for name in sorted(tensors):
        if name in expected or name.startswith(ignored):
            continue
        if pooler is not None and name.startswith(pooler):
            raise CheckpointError(f"{source}: unexpected tensor {name!r}: the config has no pooler "
                                  "(ModelConfig.pooler=False); qkv.load sets it when the weights hold one")
        if name.startswith(owned):
            raise CheckpointError(f"{source}: unexpected tensor {name!r} for config.json ({layers_field}="
                                  f"{n_layers}); the config disagrees with the weights")
        raise CheckpointError(f"{source}: unknown tensor {name!r}: not part of {unknown}; refused rather "
                              "than dropped silently")


def state_from_plan(tensors: dict[str, Tensor], plan: Plan) -> dict[str, Tensor]:
    """qkv state dict from checked Hugging Face tensors."""
    out = {ours: tensors[hf] for hf, ours, _ in plan.rows}
    for ours, parts, _ in plan.fused:
        out[ours] = torch.cat([tensors[hf] for hf in parts], dim=0)  # 3 × (C,…) -> (3C,…) (k, v: 2 × → (2C,…))
    return out


def tensors_from_plan(state: dict[str, Tensor], plan: Plan) -> dict[str, Tensor]:
    """Hugging Face tensors from a qkv state dict; each contiguous and owning its memory."""
    out = {hf: state[ours] for hf, ours, _ in plan.rows}
    for ours, parts, _ in plan.fused:
        for hf, t in zip(parts, state[ours].chunk(len(parts), dim=0)):  # (3C,…) -> 3 × (C,…); k, v: 2
            out[hf] = t
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def architectures(hf: dict[str, Any]) -> list[str]:
    archs = hf.get("architectures") or []
    return list(archs) if isinstance(archs, (list, tuple)) else [archs]


def kind_from_hf(hf: dict[str, Any], names, source: str, *, architectures_: dict[str, str],
                 refused: dict[str, str], supported: str, head_prefixes: dict[str, tuple[str, ...]],
                 classifier: tuple[str, ...] = ("classifier.",)) -> str:
    """The qkv kind of a checkpoint from its ``architectures`` (``architectures_``: kind → class
    name), else from its tensors (``head_prefixes``: kind → prefixes of that head's tensors).

    Raises:
        CheckpointError: an architecture in ``refused`` (named with why), one not known, several,
            or a classifier's tensors without an architecture saying which head they are.
    """
    archs = architectures(hf)
    for arch in archs:
        if arch in refused:
            raise CheckpointError(f"{source}: {arch}: {refused[arch]} is not supported; qkv loads "
                                  f"{supported}, and never drops a head silently")
    known = {a: k for k, a in architectures_.items()}
    if len(archs) > 1 or (archs and archs[0] not in known):
        raise CheckpointError(f"{source}: architectures={archs!r} is not supported; qkv loads {supported}")
    if archs:
        return known[archs[0]]
    if any(n.startswith(classifier) for n in names):
        raise CheckpointError(f"{source}: the weights hold a classifier head but architectures is empty; "
                              "qkv does not guess a head or drop it")
    return next((k for k, pre in head_prefixes.items() if any(n.startswith(pre) for n in names)), "encoder")


def check_tied(tensors: dict[str, Tensor], name: str, tied_to: str, source: str, *, what: str = "") -> None:
    """A decoder tensor ``name``, when present, must equal ``tied_to`` (qkv stores it once)."""
    t = tensors.get(name)
    if t is not None and not torch.equal(t, tensors[tied_to]):
        raise CheckpointError(f"{source}: {name} differs from {what or tied_to}; qkv ties them "
                              "(untied decoders are not supported)")


def activation_from_hf(act: Any, source: str, key: str = "hidden_act") -> str:
    if act not in ACT_FROM_HF:
        raise CheckpointError(f"{source}: {key}={act!r} is not supported; allowed: {', '.join(ACT_FROM_HF)}")
    return ACT_FROM_HF[act]


def labels_from_hf(hf: dict[str, Any], source: str) -> tuple[str, ...]:
    """Class names in id order from ``id2label`` (checked against ``label2id`` and ``num_labels``)."""
    id2label = hf.get("id2label")
    if id2label is None:
        return tuple(f"LABEL_{i}" for i in range(int(hf.get("num_labels", 2))))
    try:
        by_id = {int(k): v for k, v in dict(id2label).items()}
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: id2label={id2label!r} must map ids 0…L-1 to class names") from e
    if sorted(by_id) != list(range(len(by_id))) or not all(isinstance(v, str) for v in by_id.values()):
        raise CheckpointError(f"{source}: id2label={id2label!r} must map ids 0…L-1 to class names")
    labels = tuple(by_id[i] for i in range(len(by_id)))
    if "num_labels" in hf and hf["num_labels"] != len(labels):
        raise CheckpointError(f"{source}: num_labels={hf['num_labels']!r} disagrees with id2label "
                              f"({len(labels)} labels); fix one of them")
    label2id = hf.get("label2id")
    if label2id is not None and dict(label2id) != {name: i for i, name in enumerate(labels)}:
        raise CheckpointError(f"{source}: label2id={label2id!r} disagrees with id2label={id2label!r}; "
                              "fix one so that label2id[id2label[i]] == i")
    return labels


def token_task(hf: dict[str, Any], source: str, dropout: float | None = None) -> TaskConfig:
    """The :class:`TaskConfig` of a ``…ForTokenClassification`` checkpoint; ``dropout`` default:
    ``classifier_dropout``, else ``hidden_dropout_prob``."""
    if dropout is None:
        dropout = hf.get("classifier_dropout")
        dropout = hf.get("hidden_dropout_prob", 0.1) if dropout is None else dropout
    labels = labels_from_hf(hf, source)
    try:
        return TaskConfig("token-classification", labels, classifier_dropout=float(dropout))
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def sequence_task(hf: dict[str, Any], source: str, *, dropout: float | None = None, **head: Any) -> TaskConfig:
    """The :class:`TaskConfig` of a ``…ForSequenceClassification`` checkpoint: classification, or
    regression (``problem_type: regression``, or one label without a problem type); ``dropout``
    default: ``classifier_dropout``, else ``hidden_dropout_prob``; ``head``: the family's head shape
    (``pooling``, ``head``, ``head_norm``).

    Raises:
        CheckpointError: multi-label classification, an unknown problem type, regression of several
            values, bad labels.
    """
    if dropout is None:
        dropout = hf.get("classifier_dropout")
        dropout = hf.get("hidden_dropout_prob", 0.1) if dropout is None else dropout
    labels = labels_from_hf(hf, source)
    problem = hf.get("problem_type")
    if problem == "multi_label_classification":
        raise CheckpointError(f"{source}: problem_type='multi_label_classification' is not supported "
                              "(qkv classifies one label per sequence, or regresses one value)")
    if problem not in (None, "single_label_classification", "regression"):
        raise CheckpointError(f"{source}: problem_type={problem!r} is not supported; allowed: "
                              "single_label_classification, regression")
    try:
        if problem == "regression" or (problem is None and len(labels) == 1):
            if len(labels) != 1:
                raise CheckpointError(f"{source}: regression with num_labels={len(labels)} (several outputs) "
                                      "is not supported; qkv regresses one value")
            return TaskConfig("regression", (), classifier_dropout=float(dropout), **head)
        return TaskConfig("sequence-classification", labels, classifier_dropout=float(dropout), **head)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def task_fields(task: TaskConfig) -> dict[str, Any]:
    """``config.json`` fields of a task head: labels, and for a sequence task its problem type."""
    out = label_fields(task)
    if task.is_sequence:
        out["problem_type"] = "regression" if task.task == "regression" else "single_label_classification"
    return out


def head_reasons(task: TaskConfig | None, name: str, *, sequence: dict[str, Any] | None,
                 token: dict[str, Any] | None = None) -> list[str]:
    """Why a task head cannot be written as family ``name``'s: the family's head shape for sequence
    tasks (``sequence``: ``pooling``, ``head``, ``head_norm`` it needs; ``None``: it has no sequence
    head here) and token tasks (``token``; default: no head before the classifier)."""
    if task is None:
        return []
    want = sequence if task.is_sequence else (token or {"head": None, "head_norm": False})
    if want is None:
        return [f"task {task.task!r} ({name} has no such head here)"]
    have = {"pooling": task.pooling, "head": task.head, "head_norm": task.head_norm}
    bad = [f"{k}={have[k]!r}" for k, v in want.items() if (have[k] not in v if isinstance(v, tuple) else have[k] != v)]
    if not bad:
        return []
    shape = ", ".join(f"{k}={v!r}" for k, v in want.items())
    return [f"the task head's {', '.join(bad)} ({name}'s {'sequence' if task.is_sequence else 'token'} "
            f"classification head needs {shape}; qkv finetune gives a {name} model that head by default)"]


def label_fields(task: TaskConfig) -> dict[str, Any]:
    """``id2label`` / ``label2id`` of a task head, for ``config.json``."""
    names = task.labels or ("LABEL_0",)  # regression: transformers' default name of its one output
    return {"id2label": {str(i): name for i, name in enumerate(names)},
            "label2id": {name: i for i, name in enumerate(names)}}


#: Fields that none of the families here express otherwise: name → the value they need, or a
#: ``(predicate on the config, what it needs)`` pair.
_PLAIN = {"n_kv_heads": (lambda c: c.attention.n_kv_heads in (None, c.attention.n_heads),
                         "None: one key/value head per query head"),
          "qk_norm": "none",
          "local_window": None, "norm_type": "layernorm", "norm_bias": True, "mlp_bias": True,
          "feed_forward": "mlp", "embed_scale": False, "first_attention_norm": True,
          "position": "learned", "position_qk_only": False, "similarity": "scaled_dot",
          "similarity_kwargs": {}, "qkv_proj": True, "shared_qk": False, "out_proj": True, "attention_bias": True,
          "norm": "post", "embedding_norm": True,
          "activation": (lambda c: c.ffn.activation in ACT_TO_HF, f"one of {', '.join(ACT_TO_HF)}")}


def refuse_causal_lm(kind: str, name: str) -> None:
    """An encoder family refuses a causal language model in one line (GPT-2 writes those)."""
    if kind == "causal_lm":
        raise CheckpointError(f"a causal language model (kind 'causal_lm') cannot be exported as a Hugging "
                              f"Face {name}, an encoder family; export it as GPT-2: "
                              "qkv.export_hf(model, path, family='gpt2'), or build it with family='gpt2' "
                              "(the gpt2 preset sets it)")


def head_bias_reasons(config: ModelConfig, kind: str, name: str) -> list[str]:
    """The refusal of a masked-LM head without the dense bias every family here has."""
    if kind == "masked_lm" and not config.head_bias:
        return [f"head_bias=False ({name}'s masked-LM head has a dense bias: needs True)"]
    return []


def refuse_unexpressible(config: ModelConfig, name: str, needs: dict[str, Any],
                         extra: list[str] | None = None) -> None:
    """Raise :class:`CheckpointError` naming every field of ``config`` the family ``name`` cannot
    express: those of :data:`_PLAIN` and the family's own ``needs`` (field → value, or a
    ``(predicate, what it needs)`` pair; an entry of ``needs`` replaces :data:`_PLAIN`'s, so a
    family that has e.g. sliding windows passes its own ``local_window`` rule); ``extra``: more
    reasons already worded."""
    bad = []
    for key, want in {**_PLAIN, **needs}.items():
        value = flat_value(config, key)
        if isinstance(want, tuple):
            ok, text = want[0](config), want[1]
        else:
            ok, text = value == want, repr(want)
        if not ok:
            bad.append(f"{field_path(key)}={value!r} ({name} needs {text})")
    bad += extra or []
    if bad:
        raise CheckpointError(f"this model cannot be exported as a Hugging Face {name}: " + "; ".join(bad)
                              + "; keep it in the qkv format (qkv convert --to qkv; qkv.save in Python)")
