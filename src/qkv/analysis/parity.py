"""How far a converted Hugging Face model's numbers are from the original's: the trust behind the maps.

Legend: B texts, T tokens, L layers.

For a Hugging Face folder (``config.json``, no ``qkv.json``) that ``qkv.load`` converted, the same
folder is loaded by ``transformers`` itself (the class its ``architectures`` names, eager attention so
that weights are returned; local files only) and both models run on the same batch. The report gives
the largest absolute difference of the final output (logits, or the last hidden state of a bare
encoder), of every hidden state and of every attention map. Without ``transformers`` installed, or for
a folder that is not a Hugging Face one, there is no report and :func:`hf_parity` says why.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from qkv.analysis.hooked import Batch, call

__all__ = ["Parity", "hf_parity", "hf_folder"]


@dataclass
class Parity:
    """qkv's numbers against the original model's on one batch (largest absolute differences).

    Attributes:
        reference: e.g. ``"transformers 5.25.0 BertModel"``.
        output: what was compared last (``"logits"`` or ``"last_hidden_state"``).
        output_diff: max |Δ| of that output (real tokens only).
        hidden_diff: max |Δ| over the hidden states before the last (the embeddings and each layer's
            output but the last one, which ``output`` covers).
        attention_diff: max |Δ| over every attention weight.
        n_tokens: real tokens compared.
    """

    reference: str
    output: str
    output_diff: float
    hidden_diff: float
    attention_diff: float
    n_tokens: int

    def describe(self) -> str:
        return (f"parity with {self.reference} on {self.n_tokens} tokens: max |Δ| {self.output} "
                f"{self.output_diff:.1e}, hidden states {self.hidden_diff:.1e}, attention weights "
                f"{self.attention_diff:.1e}")

    def to_dict(self) -> dict:
        return asdict(self)


def hf_folder(path) -> Path | None:
    """``path`` as a folder when it is a Hugging Face model folder (``config.json`` without ``qkv.json``)."""
    if not isinstance(path, (str, Path)):
        return None
    folder = Path(path)
    return folder if (folder / "config.json").is_file() and not (folder / "qkv.json").is_file() else None


def _reference(folder: Path):
    """The folder loaded by ``transformers`` (the class ``architectures`` names), and its description."""
    import transformers  # an optional dependency: the reference is only loaded for this report (2–4 s)

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    arch = (config.get("architectures") or ["AutoModel"])[0]
    cls = getattr(transformers, arch, None) or transformers.AutoModel
    log = transformers.utils.logging
    bars, level = log.is_progress_bar_enabled(), log.get_verbosity()
    log.disable_progress_bar()  # no loading bar or load report in the middle of qkv's output
    log.set_verbosity_error()
    try:
        model = cls.from_pretrained(folder, attn_implementation="eager", local_files_only=True).eval()
    finally:
        log.set_verbosity(level)
        if bars:
            log.enable_progress_bar()
    return model, f"transformers {transformers.__version__} {type(model).__name__}"


def _max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None) -> float:
    d = (a.float() - b.float()).abs()
    if mask is not None:
        d = d[mask]  # (B,T,…) -> (N,…) real positions
    return float(d.max()) if d.numel() else 0.0


def hf_parity(path, model: nn.Module, batch: Batch) -> tuple[Parity | None, str]:
    """qkv's ``model`` against ``transformers``' load of the same folder on ``batch``.

    Returns:
        ``(Parity, "")``, or ``(None, why there is no report)``.
    """
    folder = hf_folder(path)
    if folder is None:
        return None, "not a Hugging Face folder"
    if importlib.util.find_spec("transformers") is None:
        return None, "transformers is not installed (pip install transformers for a parity report)"
    try:
        ref, name = _reference(folder)
    except Exception as exc:  # noqa: BLE001 — the reference may fail for reasons of its own; say which
        return None, f"transformers could not load {folder}: {str(exc).splitlines()[0] if str(exc) else exc!r}"
    mask = batch.attention_mask
    extra = {} if batch.token_type_ids is None else {"token_type_ids": batch.token_type_ids}
    with torch.no_grad():
        theirs = ref(batch.input_ids, attention_mask=mask.long(), output_hidden_states=True,
                     output_attentions=True, **extra)
        ours = call(model, batch, output_hidden_states=True, output_attentions=True)
    if getattr(theirs, "logits", None) is not None and getattr(ours, "logits", None) is not None:
        output, a, b = "logits", ours.logits, theirs.logits
        out_mask = mask if a.dim() == 3 else None  # per-token logits: real tokens only
    else:  # a bare encoder: its last hidden state (after a pre-LN stack's final norm, on both sides)
        output, a, b = "last_hidden_state", ours.last_hidden_state, theirs.last_hidden_state
        out_mask = mask
    # every hidden state but the last: a pre-LN stack's last one is taken before or after its final norm
    hidden = max((_max_diff(x, y, mask) for x, y in zip(ours.hidden_states[:-1], theirs.hidden_states[:-1])),
                 default=0.0)
    keys = mask[:, None, :, None] & mask[:, None, None, :]  # (B,1,T,T) real queries and keys
    attention = max(_max_diff(x, y, keys.expand_as(x)) for x, y in zip(ours.attentions, theirs.attentions))
    return Parity(name, output, _max_diff(a, b, out_mask), hidden, attention, int(mask.sum())), ""
