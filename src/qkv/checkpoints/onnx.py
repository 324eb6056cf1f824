"""The encoder of a qkv model as an ONNX file, checked against qkv in ONNX Runtime.

What is exported is the padded forward of :class:`~qkv.nn.encoder.Encoder` with a padding mask:

* inputs ``input_ids`` (int64, B×T), ``attention_mask`` (int64, B×T, 1 = real token) and, only
  when the model has segment embeddings, ``token_type_ids`` (int64, B×T);
* output ``last_hidden_state`` (float32, B×T×C); rows at padded positions are defined but
  meaningless, as in qkv;
* B and T are dynamic axes (T up to the model's ``max_len``).

The graph is made by ``torch.onnx.export(..., dynamo=True)`` (torch.export, then onnxscript):
it keeps B and T symbolic and converts grouped-query attention, which the TorchScript exporter
cannot (``enable_gqa`` of ``scaled_dot_product_attention``). The module traced is a thin wrapper
(:class:`_PaddedEncoder`) that skips :meth:`Encoder.forward`'s Python-level input checks (they
read tensor values) and always passes the padding mask.

Refused before exporting, by name: the offset score biases (``relative``, ``relative-alibi``,
``t5``, ``alibi``), whose band-building ops neither exporter traces with a dynamic length.

After the export the file is run in ONNX Runtime (CPUExecutionProvider) on a random batch of
mixed lengths other than the export sample and compared with qkv at the real positions; a
difference above ``atol`` raises :class:`ExportError` and no file is left. The file is written
under a temporary name beside ``out`` and renamed into place (:func:`qkv._fs.atomic_file`).
"""

from __future__ import annotations

import io
import os
import warnings
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from qkv._fs import atomic_file
from qkv.errors import QkvError
from qkv.checkpoints.io import Pretrained, load
from qkv.models.kinds import encoder_of

__all__ = ["export_onnx", "OnnxExport", "ExportError", "REFUSED_POSITIONS", "DEFAULT_OPSET", "INSTALL_HINT"]

#: The opset written unless asked otherwise (the dynamo exporter's native opset is 18).
DEFAULT_OPSET = 18
MIN_OPSET = 18
#: Position schemes the exporter cannot express with a dynamic length, with the reason.
REFUSED_POSITIONS = {
    "relative": "a learned offset bias (Tensor.unfold bands)",
    "relative-alibi": "a learned offset bias (Tensor.unfold bands)",
    "t5": "a bucketed offset bias (Tensor.unfold bands)",
    "alibi": "an offset bias the exporters cannot trace",
}
INSTALL_HINT = "install with pip install 'qkv[onnx]'"
OUTPUT = "last_hidden_state"


class ExportError(QkvError):
    """An export that cannot be done as asked; the message names the problem and the fix."""


@dataclass(frozen=True)
class OnnxExport:
    """What :func:`export_onnx` wrote.

    Attributes:
        path: the ONNX file.
        size: its size in bytes.
        inputs: the graph's input names, in order.
        output: the output name (``last_hidden_state``).
        opset: the ONNX opset.
        max_diff: max |ONNX Runtime − qkv| at real positions of the check batch (``None`` without check).
    """

    path: Path
    size: int
    inputs: tuple[str, ...]
    output: str
    opset: int
    max_diff: float | None


class _PaddedEncoder(nn.Module):
    """``(input_ids, attention_mask[, token_type_ids]) -> last_hidden_state``: the padded forward."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        padding_mask = attention_mask != 0  # (B,T) True = real token
        return self.encoder._stack(input_ids, token_type_ids, None, padding_mask, False, False).last_hidden_state


def _require_packages() -> None:
    missing = []
    for name in ("onnx", "onnxscript", "onnxruntime"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ExportError(f"ONNX export needs the package(s) {', '.join(missing)}; {INSTALL_HINT}")


def _encoder_of(model) -> nn.Module:
    """The :class:`Encoder` of a folder, a :class:`~qkv.checkpoints.io.Pretrained`, a model with ``.encoder``."""
    if isinstance(model, (str, os.PathLike)):
        model = load(model).model
    if isinstance(model, Pretrained):
        model = model.model
    try:
        return encoder_of(model)
    except ValueError:
        raise ExportError(f"expected a qkv model folder, an Encoder or a model with one (.encoder: MaskedLM, "
                          f"classifiers, Discriminator), got {type(model).__name__}") from None


def _check_supported(encoder: nn.Module) -> None:
    config = encoder.config
    position = config.positions.scheme
    if position in REFUSED_POSITIONS:
        raise ExportError(f"positions.scheme={position!r} cannot be exported to ONNX ({REFUSED_POSITIONS[position]}); "
                          "export a model with learned, sinusoidal, rope or no positions")


def _check_out(out: Path, overwrite: bool) -> None:
    if out.suffix != ".onnx":
        raise ExportError(f"{out}: the output file must end in .onnx")
    if out.is_dir():
        raise ExportError(f"{out}: is a folder; give a file path ending in .onnx")
    if out.exists() and not overwrite:
        raise ExportError(f"{out}: exists; pass overwrite=True (--force) to replace it, or choose another path")
    if not out.parent.is_dir():
        raise ExportError(f"{out.parent}: no such folder; create it first")


def _check_opset(opset) -> int:
    import onnx  # lazy: onnx takes 0.67 s to import and is an optional extra (qkv[onnx]); only the export needs it

    top = onnx.defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= top:
        raise ExportError(f"opset must be an integer in [{MIN_OPSET}, {top}], got {opset!r}")
    return opset


def _batch(encoder: nn.Module, B: int, T: int, seed: int) -> dict[str, Tensor]:
    """Random ids with row i padded after ``T - 2i`` tokens (at least 1 real), random segments."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, encoder.vocab_size, (B, T), generator=g)  # (B,T)
    lengths = torch.tensor([max(1, T - 2 * i) for i in range(B)])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (B,T) 1 = real
    feeds = {"input_ids": ids, "attention_mask": mask}
    if encoder.embeddings.segments is not None:
        n = encoder.embeddings.segments.num_embeddings
        feeds["token_type_ids"] = torch.randint(0, n, (B, T), generator=g)
    return feeds


def _compare(path: Path, encoder: nn.Module, feeds: dict[str, Tensor]) -> float:
    """max |ONNX Runtime − qkv| at the real positions of ``feeds``."""
    import onnxruntime as ort  # lazy: an optional extra (qkv[onnx]); only the check needs it

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(sess.run([OUTPUT], {k: v.numpy() for k, v in feeds.items()})[0])  # (B,T,C)
    with torch.no_grad():
        want = encoder(feeds["input_ids"], feeds["attention_mask"], feeds.get("token_type_ids")).last_hidden_state
    real = feeds["attention_mask"].bool()  # (B,T)
    if got.shape != want.shape:
        raise ExportError(f"the exported graph gives shape {tuple(got.shape)}, qkv {tuple(want.shape)}")
    return float((got - want).abs()[real].max())


def _export(wrapper: nn.Module, sample: dict[str, Tensor], path: Path, opset: int, max_len: int) -> None:
    names = list(sample)
    batch = torch.export.Dim("batch")
    length = torch.export.Dim("length", max=max_len)
    shapes = {n: {0: batch, 1: length} for n in names}
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), redirect_stdout(log), redirect_stderr(log):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(wrapper, tuple(sample.values()), input_names=names, output_names=[OUTPUT],
                                        dynamic_shapes=shapes, dynamo=True, opset_version=opset,
                                        external_data=False, verbose=False)
            program.save(str(path))
    except Exception as e:  # noqa: BLE001 - the exporter's many error types, named in one line
        first = next((x for x in str(e).splitlines() if x.strip()), type(e).__name__)
        raise ExportError(f"torch.onnx.export failed: {type(e).__name__}: {first[:300]} — this model variant is not "
                          "exportable; rerun with --debug (QKV_DEBUG=1) for the exporter's report") from e


def export_onnx(model_or_folder, out: str | os.PathLike, *, opset: int = DEFAULT_OPSET, overwrite: bool = False,
                check: bool = True, atol: float = 1e-4) -> OnnxExport:
    """Export the encoder of a qkv model to an ONNX file with dynamic batch and length.

    Args:
        model_or_folder: a model folder (qkv or Hugging Face, as :func:`qkv.load` reads), a
            :class:`~qkv.checkpoints.io.Pretrained`, an :class:`~qkv.nn.encoder.Encoder`, or a model with one
            (``.encoder``: :class:`~qkv.models.mlm.MaskedLM`, the task models, the discriminator).
        out: the ``.onnx`` file to write.
        opset: ONNX opset (18 … the installed onnx's newest).
        overwrite: replace an existing file at ``out`` (never a folder).
        check: run the file in ONNX Runtime and compare with qkv (see the module docstring).
        atol: the largest max |diff| at real positions the check accepts.

    Returns:
        :class:`OnnxExport`.

    Raises:
        ExportError: missing packages, a refused variant, a bad ``out`` or ``opset``, a failed
            export or check (no file is left then).
    """
    _require_packages()
    out = Path(out)
    _check_out(out, overwrite)
    opset = _check_opset(opset)
    encoder = _encoder_of(model_or_folder)
    _check_supported(encoder)
    was_training = encoder.training
    encoder.eval()
    try:
        max_len = encoder.max_len
        sample = _batch(encoder, 2, min(max_len, 8), seed=0)  # the export sample; B, T ≥ 2: not specialised
        if max_len < 2:
            raise ExportError(f"max_len={max_len}: a dynamic length needs max_len ≥ 2")
        max_diff = None
        with atomic_file(out) as tmp:
            _export(_PaddedEncoder(encoder).eval(), sample, tmp, opset, max_len)
            if check:  # another B and T than the sample's, padded rows: the dynamic axes at work
                max_diff = _compare(tmp, encoder, _batch(encoder, 3, min(max_len, 13), seed=1))
                if not max_diff <= atol:
                    raise ExportError(f"check failed: ONNX Runtime and qkv differ by max |diff| {max_diff:.3g} > "
                                      f"{atol:g} at real positions; no file was written")
        return OnnxExport(out, out.stat().st_size, tuple(sample), OUTPUT, opset, max_diff)
    finally:
        encoder.train(was_training)
