"""The one error type of qkv: :class:`QkvError`, and the device-name check every command shares.

Every problem the user can fix — a bad option, a missing or corrupt file, a run folder in use —
raises a :class:`QkvError` (a ``ValueError``) whose message names the problem and the way out.
The packages' own error classes (``CorpusError``, ``CheckpointError``, ``EmbeddingError``,
``RunError``, ``TrainingError``) derive from it, so that the command line's one handler
(:func:`qkv.cli.main`) prints ``qkv <command>: error: <message>`` and exits 2.
"""

from __future__ import annotations

__all__ = ["QkvError", "CheckpointError", "check_device"]


class QkvError(ValueError):
    """A problem the user can fix; ``str(error)`` names it and the fix, in one line if possible."""


class CheckpointError(QkvError):
    """A checkpoint folder or file that cannot be loaded or written as asked; the message names the
    file, the tensor or field, and the expected versus found value."""


def check_device(device) -> None:
    """Raise :class:`QkvError` unless ``device`` is ``None``, ``"auto"`` or a name torch accepts.

    Args:
        device: ``None``, ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device`` …
    """
    if device is None or device == "auto":
        return
    # lazy: qkv.errors stays free of torch (1.2 s to import): the CLI's error path and config checks use it
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise QkvError(f"--device {device!r} is not a device; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise QkvError(f"--device {device!r} asked for, but torch sees no CUDA device; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise QkvError(f"--device {device!r} asked for, but torch sees {n} CUDA device{'s' * (n != 1)} "
                       f"(cuda:0 … cuda:{n - 1}); use one of them")
