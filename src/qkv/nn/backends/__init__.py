"""Execution paths of attention behind one interface (:class:`Backend`), and their registry.

Built in: ``sdpa`` (torch's fused kernel), ``explicit`` (materialised scores; weights),
``chunked`` (blocks of queries; bounded memory, checkpointed under autograd), ``offset_flash``
(relative/T5/ALiBi biases on the flash kernel, learned-table gradient included) and ``inplace``
(weights without autograd, the only score-sized tensor). Each is tested against ``explicit``.
:func:`qkv.nn.attend.choose_backend` picks one; see docs/architecture.md for adding your own.
"""

from qkv.nn.backends.base import (
    BACKENDS,
    AttendCall,
    Backend,
    Features,
    backend_names,
    needs_grad,
    register_backend,
)
from qkv.nn.backends import chunked, explicit, inplace, offset_flash, sdpa  # noqa: E402,F401  (registers them)

__all__ = ["BACKENDS", "AttendCall", "Backend", "Features", "backend_names", "needs_grad",
           "register_backend"]
