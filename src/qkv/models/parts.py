"""The names a :class:`~qkv.config.ModelConfig` gives to parts, resolved: :func:`check_parts`.

A configuration holds names (a similarity, an attention backend, a position scheme, a norm, an
activation, a feed-forward form, a qk-norm); this module checks each against the registry
that makes the part, loading the installed plugins first when a name is unknown (:mod:`qkv.plugins`),
and refuses what is still unknown with one line naming the field, the value, what is allowed and how
to load a plugin. The builders call it before they build anything; commands that write a run folder
call it before they write.
"""

from __future__ import annotations

from qkv import plugins
from qkv.config import ModelConfig
from qkv.nn.backends import backend_names
from qkv.nn.activations import ACTIVATIONS
from qkv.nn.feed_forward import FEED_FORWARDS
from qkv.nn.norms import NORM_TYPES
from qkv.nn.positional import POSITION_SCHEMES
from qkv.nn.qk_norm import QK_NORM_TYPES
from qkv.nn.similarity import SIMILARITIES

__all__ = ["check_parts"]


def _registered(config: ModelConfig) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """``(field, kind, value, allowed)`` of each field naming a part that a plugin may register."""
    a = config.attention
    return [("attention.similarity", "similarity", a.similarity, tuple(sorted(SIMILARITIES))),
            ("attention.backend", "backend", a.backend, backend_names()),
            ("positions.scheme", "position", config.positions.scheme, tuple(POSITION_SCHEMES)),
            ("norm.kind", "norm", config.norm.kind, tuple(sorted(NORM_TYPES)))]


def check_parts(config: ModelConfig) -> ModelConfig:
    """``config`` when every part it names exists (see the module docstring), else ``ValueError``."""
    if not isinstance(config, ModelConfig):
        raise ValueError(f"expected a ModelConfig, got {type(config).__name__}")
    if any(value not in allowed for _, _, value, allowed in _registered(config)):
        plugins.load_plugins()
    for name, kind, value, allowed in _registered(config):
        if value not in allowed:
            raise ValueError(f"{name}={value!r} is not allowed; allowed: {', '.join(map(str, allowed))}. "
                             f"A {kind} from a plugin: {plugins.how_to_load()}")
    fixed = (("ffn.activation", config.ffn.activation, tuple(ACTIVATIONS)),
             ("ffn.kind", config.ffn.kind, tuple(FEED_FORWARDS)),
             ("attention.qk_norm", config.attention.qk_norm, QK_NORM_TYPES))
    for name, value, allowed in fixed:
        if value not in allowed:
            raise ValueError(f"{name}={value!r} is not allowed; allowed: {', '.join(allowed)}")
    if config.positions.qk_only and POSITION_SCHEMES[config.positions.scheme].slot != "input":
        absolute = [n for n, s in POSITION_SCHEMES.items() if s.slot == "input"]
        raise ValueError(f"positions.qk_only=True needs an input encoding; positions.scheme="
                         f"{config.positions.scheme!r} is not one; allowed with it: {', '.join(absolute)}")
    return config
