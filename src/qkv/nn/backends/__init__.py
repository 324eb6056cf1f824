"""The registry of attention backends: :data:`BACKENDS`, :func:`register_backend`, :func:`backend_names`.

A backend is one way to execute the staged core of :func:`qkv.nn.attend.attend` (the interface and
the declarations it makes are in :mod:`qkv.nn.backends.base`). Built in, each in its own module and
each tested against ``explicit``: ``sdpa`` (torch's fused kernel), ``explicit`` (materialised scores;
weights), ``chunked`` (blocks of queries; bounded memory, checkpointed under autograd),
``offset_flash`` (relative/T5/ALiBi biases on the flash kernel, learned-table gradient included) and
``inplace`` (weights without autograd, the only score-sized tensor).

Adding a backend is one file (see docs/architecture.md)::

    from qkv.nn.backends import register_backend
    from qkv.nn.backends.base import Backend, Supports

    @register_backend("mine")
    class MyBackend(Backend):
        supports = Supports(weights=False, ...)  # what it can run: read by choose_backend
        def run(self, call): ...                 # -> AttendOutput
        def claims(self, features): ...          # optional: take calls under backend="auto"
"""

from __future__ import annotations

from qkv import plugins
from qkv.nn.backends.base import Backend
from qkv.nn.backends.chunked import ChunkedBackend
from qkv.nn.backends.explicit import ExplicitBackend
from qkv.nn.backends.inplace import InplaceBackend
from qkv.nn.backends.offset_flash import OffsetFlashBackend
from qkv.nn.backends.sdpa import SdpaBackend

__all__ = ["BACKENDS", "register_backend", "backend_names"]

#: Registered backends by name, built-in ones first.
BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, *, builtin: bool = False):
    """Class decorator: register an instance of a :class:`~qkv.nn.backends.base.Backend` subclass as
    ``name`` (the defining module is recorded: :func:`qkv.plugins.registered_by`; outside qkv, a
    plugin: docs/plugins.md)."""

    def deco(cls):
        if name in BACKENDS or name == "auto":
            raise ValueError(f"attention backend {name!r} is already registered "
                             f"(by {plugins.registered_by('backend', name) or 'qkv'})")
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise ValueError(f"register_backend({name!r}) needs a subclass of qkv.nn.backends.base.Backend")
        cls.name, cls.builtin = name, builtin
        BACKENDS[name] = cls()
        plugins.record_part("backend", name, cls)
        return cls

    return deco


def backend_names() -> tuple[str, ...]:
    """``"auto"`` and every registered backend's name."""
    return ("auto", *BACKENDS)


for _name, _cls in (("sdpa", SdpaBackend), ("explicit", ExplicitBackend), ("chunked", ChunkedBackend),
                    ("offset_flash", OffsetFlashBackend), ("inplace", InplaceBackend)):
    register_backend(_name, builtin=True)(_cls)
