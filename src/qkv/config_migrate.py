"""The flat field names of format 1 and where each lives now: the one mapping behind reading old
``qkv.json`` files, preset overrides and ``--model KEY=VALUE``.

Format 1 (qkv before the nested configuration) stored :class:`~qkv.config.ModelConfig` as one flat
object of 45 fields. Format 2 nests the attention, position, feed-forward and norm fields in
sub-configurations and lists each layer's type. :func:`nest` turns a flat mapping (or one that mixes
flat names with nested ones) into the nested form; it imports nothing of qkv, so reading a
configuration never imports a model.

Legend: each entry of :data:`FLAT` is ``flat name -> (sub-configuration, field)``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FLAT", "SECTIONS", "nest", "layer_types_for"]

#: The sub-configurations of :class:`~qkv.config.ModelConfig`, by field name.
SECTIONS = ("attention", "positions", "ffn", "norm")

#: flat name (format 1, and the short names preset overrides accept) → (section, field).
FLAT: dict[str, tuple[str, str]] = {
    "n_heads": ("attention", "n_heads"),
    "n_kv_heads": ("attention", "n_kv_heads"),
    "similarity": ("attention", "similarity"),
    "similarity_kwargs": ("attention", "similarity_kwargs"),
    "qkv_proj": ("attention", "qkv_proj"),
    "out_proj": ("attention", "out_proj"),
    "shared_qk": ("attention", "shared_qk"),
    "attention_bias": ("attention", "bias"),
    "attention_dropout": ("attention", "dropout"),
    "attention_path": ("attention", "backend"),  # renamed in format 2
    "backend": ("attention", "backend"),
    "chunk_size": ("attention", "chunk_size"),
    "qk_norm": ("attention", "qk_norm"),
    "qk_norm_scale": ("attention", "qk_norm_scale"),
    "local_window": ("attention", "window"),
    "position": ("positions", "scheme"),
    "position_qk_only": ("positions", "qk_only"),
    "max_distance": ("positions", "max_distance"),
    "num_buckets": ("positions", "num_buckets"),
    "rope_base": ("positions", "rope_base"),
    "local_rope_base": ("positions", "local_rope_base"),
    "position_offset": ("positions", "offset"),
    "d_ff": ("ffn", "d_ff"),
    "activation": ("ffn", "activation"),
    "feed_forward": ("ffn", "kind"),
    "mlp_bias": ("ffn", "bias"),
    "norm_type": ("norm", "kind"),
    "layer_norm_eps": ("norm", "eps"),
    "norm_bias": ("norm", "bias"),
    "first_attention_norm": ("norm", "first_attention"),
    "embedding_norm": ("norm", "embeddings"),
}


def layer_types_for(n_layers: int, global_every: int) -> tuple[str, ...]:
    """Format 1's sliding-window layout: layer i is global when ``i % global_every == 0``, else local
    (ModernBERT: every third layer global)."""
    return tuple("global" if i % global_every == 0 else "local" for i in range(n_layers))


def nest(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every flat name moved into its section (see the module docstring).

    ``norm`` given as a string is format 1's placement (``"post"`` / ``"pre"``); ``global_every``
    (format 1) is kept as it is: :meth:`~qkv.config.ModelConfig.from_dict` makes it ``layer_types``
    (:func:`layer_types_for`) once the number of layers is known. Nested sections given as dicts are merged
    with the flat names that land in them (a flat name wins over the same nested field only if the
    nested one is absent; both given is an error naming the two).
    """
    out: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    global_every = data.get("global_every")
    for key, value in data.items():  # the nested sections first, so that a flat name is checked against them
        if key in SECTIONS and isinstance(value, dict):
            sections.setdefault(key, {}).update(value)
    for key, value in data.items():
        if key == "global_every" or (key in SECTIONS and isinstance(value, dict)):
            continue
        if key == "norm" and isinstance(value, str):
            key = "norm_placement"
            section, name = "norm", "placement"
        elif key in FLAT:
            section, name = FLAT[key]
        else:
            out[key] = value
            continue
        if name in sections.get(section, {}):
            raise ValueError(f"{'norm' if key == 'norm_placement' else key} and {section}.{name} both given; give one")
        sections.setdefault(section, {})[name] = value
    for section, fields in sections.items():
        out[section] = fields
    if global_every is not None:
        out["global_every"] = global_every  # made layer types once n_layers is known (ModelConfig.from_dict)
    return out
