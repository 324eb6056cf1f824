"""One numbering convention for layers and heads, everywhere qkv shows them.

Layers and heads are numbered from 0, as the model's module paths (``encoder.layers.0``) and the hook
names are: layer i is ``L{i}``, head h of layer i ``L{i}H{h}`` (TransformerLens writes them the same
way). Hidden states count the embedding output first: ``emb``, then ``L{i}`` for the output of layer i.
Reports, figures, the viewer, the CLI's messages and file names (``attention_layer_0.png``) all use it.
"""

from __future__ import annotations

__all__ = ["layer_label", "head_label", "hidden_label", "parse_head"]


def layer_label(layer: int) -> str:
    """``L{layer}``, layers from 0."""
    return f"L{layer}"


def head_label(layer: int, head: int) -> str:
    """``L{layer}H{head}``, both from 0."""
    return f"L{layer}H{head}"


def hidden_label(i: int) -> str:
    """Hidden state i (0 = the embedding output, i = the output of layer i-1): ``emb``, ``L0``, ``L1``, …"""
    return "emb" if i == 0 else layer_label(i - 1)


def parse_head(text: str) -> tuple[int, int]:
    """``"L2H5"`` → ``(2, 5)``.

    Raises:
        ValueError: not of the form ``L<layer>H<head>``.
    """
    t = text.strip().upper()
    if not t.startswith("L") or "H" not in t:
        raise ValueError(f"{text!r} is not a head; write L<layer>H<head>, both from 0, e.g. L2H5")
    layer, _, head = t[1:].partition("H")
    if not (layer.isdigit() and head.isdigit()):
        raise ValueError(f"{text!r} is not a head; write L<layer>H<head>, both from 0, e.g. L2H5")
    return int(layer), int(head)
