"""Plugins: modules outside qkv that register parts — similarities, attention backends, norms, position
schemes — and the record of which module registered which part.

A plugin is an ordinary Python module whose import registers its parts with the registries'
decorators (:func:`qkv.nn.similarity.register_similarity`, :func:`qkv.nn.backends.register_backend`,
:func:`qkv.nn.norms.register_norm`, :func:`qkv.nn.positional.register_position`). qkv imports one

* **found by entry point**: every entry point of the group :data:`GROUP` (``qkv.plugins``) of the
  installed distributions (its value names the module), or named in the environment variable
  :data:`ENV` (``QKV_PLUGINS``, comma-separated module names; the command line sets it for the
  processes it starts, e.g. ``qkv ablate``'s workers). These load once, lazily, by
  :func:`load_plugins`: at the start of every ``qkv`` command, in :func:`qkv.load`, and when a
  registry lookup misses (a :class:`~qkv.config.ModelConfig` naming an unknown part);
* **named**: ``--plugin MODULE`` on any ``qkv`` command, ``qkv.load(path, plugins=[...])`` or
  :func:`import_plugins` — or a plain ``import``.

A module that registers a part is recorded (:func:`registered_by`); :func:`qkv.save` writes the
plugin modules a model's config needs into ``qkv.json`` (:func:`plugins_needed`), so that loading
it without them names the module to install or import. qkv never imports a module because a
checkpoint names it: a model folder cannot run code; installed entry points and modules the user
names can. See docs/plugins.md.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from collections.abc import Iterable

from qkv.errors import QkvError
from importlib.metadata import entry_points

__all__ = ["GROUP", "ENV", "KINDS", "PluginError", "load_plugins", "import_plugins", "record_part",
           "registered_by", "parts", "plugins_needed", "check_recorded", "how_to_load", "failed_plugins",
           "share_with_children", "unknown_part"]

#: The entry-point group a distribution declares its plugin modules in.
GROUP = "qkv.plugins"
#: Environment variable of extra plugin modules (comma-separated), imported with the entry points.
ENV = "QKV_PLUGINS"
#: The kinds of part a plugin may register, and the :class:`~qkv.config.ModelConfig` field that names each.
KINDS = {"similarity": "attention.similarity", "backend": "attention.backend", "norm": "norm.kind",
         "position": "positions.scheme"}

_PARTS: dict[tuple[str, str], str] = {}  # (kind, name) -> the module that registered it
_importing: list[str] = []  # plugin modules being imported now (innermost last)
_loaded = False  # entry points and $QKV_PLUGINS imported
_failed: dict[str, str] = {}  # plugin module -> why its import failed


class PluginError(QkvError):
    """A plugin module that could not be imported, or a part a model needs that no plugin registered."""


def record_part(kind: str, name: str, obj: object) -> str:
    """Record that ``name`` of ``kind`` was registered; return the module credited with it: ``"qkv"``
    for a part defined in qkv, else the plugin module being imported (:func:`import_plugins`, an entry
    point), else the module defining ``obj``. Called by the registries' decorators."""
    module = getattr(obj, "__module__", None) or "__main__"
    if module == "qkv" or module.startswith("qkv."):  # a built-in (perhaps imported by a plugin): qkv's
        module = "qkv"
    elif _importing:
        module = _importing[-1]
    _PARTS[(kind, name)] = module
    return module


def registered_by(kind: str, name: str) -> str | None:
    """The module that registered ``name`` of ``kind`` (``"qkv"`` for a built-in), or ``None``."""
    return _PARTS.get((kind, name))


def parts() -> dict[tuple[str, str], str]:
    """Every registered part: ``{(kind, name): module}``."""
    return dict(_PARTS)


def failed_plugins() -> dict[str, str]:
    """Plugin modules found by entry point or ``$QKV_PLUGINS`` whose import failed, and why."""
    return dict(_failed)


def _import(module: str) -> None:
    _importing.append(module)
    try:
        importlib.import_module(module)
    finally:
        _importing.pop()


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def import_plugins(modules: Iterable[str]) -> list[str]:
    """Import each plugin module of ``modules`` (dotted names) once; return them.

    Raises:
        PluginError: a module that could not be imported, naming it and the reason.
    """
    modules = [modules] if isinstance(modules, str) else list(modules)
    for module in modules:
        if not isinstance(module, str) or not module.strip():
            raise PluginError(f"plugin module {module!r} is not a module name; give a dotted name such as "
                              "'mypackage.qkv_parts'")
        if module in sys.modules:
            continue
        try:
            _import(module)
        except Exception as exc:  # any failure of the user's module: one line naming it
            raise PluginError(f"plugin module {module!r} could not be imported: {_why(exc)}; install it "
                              "or put it on PYTHONPATH") from exc
    return modules


def _entry_point_modules() -> list[str]:
    found = []
    for ep in entry_points(group=GROUP):
        module = ep.value.split(":")[0].strip()
        if module and module not in found:
            found.append(module)
    return found


def load_plugins() -> None:
    """Import, once, the modules of every ``qkv.plugins`` entry point and of ``$QKV_PLUGINS``.

    A module whose import fails is not fatal here (another plugin's part may be all a command needs):
    it gives a warning and is named again when a part it might have registered is missing
    (:func:`failed_plugins`).
    """
    global _loaded
    if _loaded:
        return
    _loaded = True
    env = [m.strip() for m in os.environ.get(ENV, "").split(",") if m.strip()]
    for module in [*_entry_point_modules(), *env]:
        if module in sys.modules:
            continue
        try:
            _import(module)
        except Exception as exc:  # a broken installed plugin: warned, remembered, named on a miss
            _failed[module] = _why(exc)
            warnings.warn(f"qkv plugin {module!r} could not be imported: {_why(exc)}", stacklevel=2)


def share_with_children(modules: Iterable[str]) -> None:
    """Add ``modules`` to ``$QKV_PLUGINS``, so that processes this one starts import them too."""
    have = [m for m in os.environ.get(ENV, "").split(",") if m]
    new = [m for m in modules if m not in have]
    if new:
        os.environ[ENV] = ",".join(have + new)


def how_to_load(module: str | None = None) -> str:
    """The ways to make a plugin's parts available (``module``: the one to load, if known)."""
    m = module or "MODULE"
    text = (f"install the package that provides it (entry point group {GROUP!r}), or import the plugin "
            f"module: --plugin {m} on the command line, qkv.load(..., plugins=[{m!r}]), or "
            f"`import {m}` first (see docs/plugins.md)")
    if _failed:
        text += "; plugins that failed to import: " + ", ".join(f"{k} ({v})" for k, v in _failed.items())
    return text


def plugins_needed(config) -> list[dict[str, str]]:
    """The parts of ``config`` (a :class:`~qkv.config.ModelConfig`) registered outside qkv:
    ``[{"kind", "name", "module"}]`` — what :func:`qkv.save` records in ``qkv.json``."""
    needed = []
    for kind, field in KINDS.items():
        section, attr = field.split(".")
        name = getattr(getattr(config, section), attr)
        module = registered_by(kind, name)
        if module is not None and module != "qkv":
            needed.append({"kind": kind, "name": name, "module": module})
    return needed


def check_recorded(recorded, source: str) -> None:
    """Raise :class:`PluginError` naming the module to load for each part in ``recorded`` (the
    ``plugins`` list of a ``qkv.json``) that no loaded plugin has registered."""
    if not isinstance(recorded, list):
        raise PluginError(f"{source}: 'plugins' must be a list of {{kind, name, module}}, got {recorded!r}")
    for entry in recorded:
        if not (isinstance(entry, dict) and {"kind", "name", "module"} <= set(entry)):
            raise PluginError(f"{source}: 'plugins' entry {entry!r} needs kind, name and module")
        if registered_by(entry["kind"], entry["name"]) is not None:
            continue
        part = f"{source}: the model uses {entry['kind']} {entry['name']!r}"
        if entry["module"] == "__main__":
            raise PluginError(f"{part}, registered by a script (__main__) when it was saved; register it again "
                              "in this process before loading, or move it into a module and load that (see "
                              "docs/plugins.md)")
        raise PluginError(f"{part} from plugin module {entry['module']!r}, which is not loaded; "
                          f"{how_to_load(entry['module'])}")


def unknown_part(kind: str, name: str, allowed: Iterable[str]) -> str:
    """The message for a ``kind`` named ``name`` that nothing registered (``allowed``: the names that are)."""
    article = "An" if kind[:1] in "aeiou" else "A"
    return (f"unknown {kind} {name!r}; allowed: {', '.join(map(str, allowed))}. {article} {kind} from a plugin: "
            + how_to_load())
