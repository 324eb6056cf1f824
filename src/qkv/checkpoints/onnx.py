"""A qkv model as an ONNX file — its encoder, or a whole pipeline — checked against qkv in ONNX Runtime.

What is exported is a padded forward with a padding mask (:mod:`qkv.checkpoints.onnx_graphs`):

* inputs ``input_ids`` (int64, B×T), ``attention_mask`` (int64, B×T, 1 = real token) and, only
  when the model has segment embeddings, ``token_type_ids`` (int64, B×T);
* the output of the ``pipeline`` asked for: ``encoder`` (default) ``last_hidden_state`` (float32,
  B×T×C; rows at padded positions are defined but meaningless, as in qkv); ``embeddings``
  ``sentence_embedding`` (B×K·C: the folder's or the given pooling, layers and normalisation, as
  :func:`qkv.embed` gives for a text within one window); ``classifier`` ``logits`` (B×L, or B×T×L
  for token classification); ``causal-lm`` ``logits`` (B×T×V);
* B and T are dynamic axes (T up to the model's ``max_len``).

The graph is made by ``torch.onnx.export(..., dynamo=True)`` (torch.export, then onnxscript):
it keeps B and T symbolic and converts grouped-query attention, which the TorchScript exporter
cannot (``enable_gqa`` of ``scaled_dot_product_attention``). The module traced is a thin wrapper
(:mod:`qkv.checkpoints.onnx_graphs`) that skips :meth:`Encoder.forward`'s Python-level input checks (they
read tensor values) and always passes the padding mask.

Refused before exporting, by name: the offset score biases (``relative``, ``relative-alibi``,
``t5``, ``alibi``), whose band-building ops neither exporter traces with a dynamic length.

After the export the file is run in ONNX Runtime (CPUExecutionProvider) on a random batch of
mixed lengths other than the export sample and compared with qkv at the real positions; a
difference above ``atol`` raises :class:`ExportError` and no file is left. The file is written
under a temporary name beside ``out`` (its folder created when missing) and renamed into place
(:func:`qkv._fs.atomic_file`).
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
from qkv.checkpoints.bundled import model_folder
from qkv.checkpoints.io import Pretrained, load
from qkv.checkpoints.onnx_graphs import PIPELINES, graph_of
from qkv.embeddings.embedder import resolve_model
from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.options import as_options
from qkv.embeddings.pooling import pool, select_layers
from qkv.errors import QkvError
from qkv.models.causal_lm import CausalLM
from qkv.models.kinds import encoder_of
from qkv.models.task_models import TokenClassifier

__all__ = ["export_onnx", "OnnxExport", "ExportError", "REFUSED_POSITIONS", "DEFAULT_OPSET", "INSTALL_HINT",
           "PIPELINES"]

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


class ExportError(QkvError):
    """An export that cannot be done as asked; the message names the problem and the fix."""


@dataclass(frozen=True)
class OnnxExport:
    """What :func:`export_onnx` wrote.

    Attributes:
        path: the ONNX file.
        size: its size in bytes.
        inputs: the graph's input names, in order.
        output: the output name (``last_hidden_state``, ``sentence_embedding``, ``logits``).
        pipeline: what the graph computes (a key of :data:`PIPELINES`).
        opset: the ONNX opset.
        max_diff: max |ONNX Runtime − qkv| at real positions of the check batch (``None`` without check).
    """

    path: Path
    size: int
    inputs: tuple[str, ...]
    output: str
    opset: int
    max_diff: float | None
    pipeline: str = "encoder"


def _require_packages() -> None:
    missing = []
    for name in ("onnx", "onnxscript", "onnxruntime"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ExportError(f"ONNX export needs the package(s) {', '.join(missing)}; {INSTALL_HINT}")


def _model_of(model) -> nn.Module:
    """The model of a folder (or a bundled model's short name) or a :class:`~qkv.checkpoints.io.Pretrained`."""
    if isinstance(model, (str, os.PathLike)):
        model = load(model_folder(model)).model
    return model.model if isinstance(model, Pretrained) else model


def _encoder_of(model) -> nn.Module:
    """The :class:`Encoder` of a model (a causal LM's decoder stack)."""
    if isinstance(model, CausalLM):
        return model.decoder
    try:
        return encoder_of(model)
    except ValueError:
        name = type(model).__name__
        raise ExportError(f"{'an' if name[0] in 'AEIOU' else 'a'} {name} has no text encoder to export; export takes "
                          "a text model folder (an encoder, masked LM, classifier, discriminator, causal LM or "
                          "encoder-decoder)") from None


def _embed_options(model_or_folder, encoder: nn.Module, options) -> dict:
    """``pooling``, ``layers``, ``normalize`` of the embeddings pipeline: ``options`` over the folder's."""
    options = as_options(options)
    folder = {}
    if isinstance(model_or_folder, (str, os.PathLike)):
        try:
            _, _, folder, _ = resolve_model(model_or_folder)
        except EmbeddingError as e:
            raise ExportError(str(e)) from None
    limit = encoder.max_len
    try:
        o = options.with_folder_defaults(folder, max_positions=limit).resolved(n_layers=len(encoder.layers),
                                                                                 max_positions=limit)
    except EmbeddingError as e:
        raise ExportError(str(e)) from None
    return {"pooling": o.pooling, "layers": tuple(o.layers), "normalize": bool(o.normalize)}


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
    if out.parent.exists() and not out.parent.is_dir():
        raise ExportError(f"{out.parent}: is a file, not a folder; choose another path")


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


def _reference(model: nn.Module, pipeline: str, feeds: dict[str, Tensor], embed: dict) -> tuple[Tensor, bool]:
    """qkv's own output for ``feeds`` through the model's ordinary forward, and whether it has a
    length axis (compared at the real positions only)."""
    ids, mask, types = feeds["input_ids"], feeds["attention_mask"], feeds.get("token_type_ids")
    with torch.no_grad():
        if pipeline == "causal-lm":
            return model(ids, mask).logits, True  # (B,T,V)
        if pipeline == "classifier":
            return model(ids, mask, types).logits, isinstance(model, TokenClassifier)  # (B,L) | (B,T,L)
        encoder = _encoder_of(model)
        if pipeline == "embeddings":
            out = encoder(ids, mask, types, output_hidden_states=True)
            v = pool(select_layers(out.hidden_states, embed["layers"]), mask, embed["pooling"])  # (B,K·C)
            return (torch.nn.functional.normalize(v, dim=-1) if embed["normalize"] else v), False
        return encoder(ids, mask, types).last_hidden_state, True  # (B,T,C)


def _compare(path: Path, output: str, want: Tensor, per_token: bool, feeds: dict[str, Tensor]) -> float:
    """max |ONNX Runtime − qkv| (at the real positions of ``feeds`` for per-token outputs)."""
    import onnxruntime as ort  # lazy: an optional extra (qkv[onnx]); only the check needs it

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(sess.run([output], {k: v.numpy() for k, v in feeds.items()})[0])
    if got.shape != want.shape:
        raise ExportError(f"the exported graph gives shape {tuple(got.shape)}, qkv {tuple(want.shape)}")
    diff = (got - want).abs()
    return float((diff[feeds["attention_mask"].bool()] if per_token else diff).max())


def _export(wrapper: nn.Module, sample: dict[str, Tensor], path: Path, opset: int, max_len: int,
            output: str) -> None:
    names = list(sample)
    batch = torch.export.Dim("batch")
    length = torch.export.Dim("length", max=max_len)
    shapes = {n: {0: batch, 1: length} for n in names}
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), redirect_stdout(log), redirect_stderr(log):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(wrapper, tuple(sample.values()), input_names=names, output_names=[output],
                                        dynamic_shapes=shapes, dynamo=True, opset_version=opset,
                                        external_data=False, verbose=False)
            program.save(str(path))
    except Exception as e:  # noqa: BLE001 - the exporter's many error types, named in one line
        first = next((x for x in str(e).splitlines() if x.strip()), type(e).__name__)
        raise ExportError(f"torch.onnx.export failed: {type(e).__name__}: {first[:300]} — this model variant is not "
                          "exportable; rerun with --debug (QKV_DEBUG=1) for the exporter's report") from e


def export_onnx(model_or_folder, out: str | os.PathLike, *, opset: int = DEFAULT_OPSET, overwrite: bool = False,
                check: bool = True, atol: float = 1e-4, pipeline: str = "encoder", options=None) -> OnnxExport:
    """Export the encoder of a qkv model, or a whole pipeline, to an ONNX file with dynamic batch and length.

    Args:
        model_or_folder: a model folder (qkv or Hugging Face, as :func:`qkv.load` reads; or a bundled
            model's short name), a :class:`~qkv.checkpoints.io.Pretrained`, an
            :class:`~qkv.nn.encoder.Encoder`, or a model with one (``.encoder``:
            :class:`~qkv.models.mlm.MaskedLM`, the task models, the discriminator; a causal LM).
        out: the ``.onnx`` file to write (its folder is created when missing).
        pipeline: ``"encoder"``, ``"embeddings"``, ``"classifier"`` or ``"causal-lm"`` (see the
            module docstring).
        options: for ``embeddings``: :class:`~qkv.embeddings.options.EmbedOptions` (``pooling``,
            ``layers``, ``normalize``; unset ones from the folder's settings, else mean, last layer,
            normalised).
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
    if pipeline not in PIPELINES:
        raise ExportError(f"pipeline={pipeline!r} is not allowed; allowed: {', '.join(PIPELINES)}")
    out = Path(out)
    _check_out(out, overwrite)
    opset = _check_opset(opset)
    model = _model_of(model_or_folder)
    encoder = _encoder_of(model)
    _check_supported(encoder)
    embed = _embed_options(model_or_folder, encoder, options) if pipeline == "embeddings" else {}
    try:
        graph = graph_of(model, pipeline, **embed)
    except ValueError as e:
        raise ExportError(str(e)) from None
    output = PIPELINES[pipeline]
    was_training = model.training
    model.eval()
    try:
        max_len = encoder.max_len
        if max_len < 2:
            raise ExportError(f"max_len={max_len}: a dynamic length needs max_len ≥ 2")
        sample = _batch(encoder, 2, min(max_len, 8), seed=0)  # the export sample; B, T ≥ 2: not specialised
        check_feeds = _batch(encoder, 3, min(max_len, 13), seed=1)  # another B and T, padded rows
        if pipeline == "causal-lm":
            sample.pop("token_type_ids", None)
            check_feeds.pop("token_type_ids", None)
        max_diff = None
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(out) as tmp:
            _export(graph.eval(), sample, tmp, opset, max_len, output)
            if check:
                want, per_token = _reference(model, pipeline, check_feeds, embed)
                max_diff = _compare(tmp, output, want, per_token, check_feeds)
                if not max_diff <= atol:
                    raise ExportError(f"check failed: ONNX Runtime and qkv differ by max |diff| {max_diff:.3g} > "
                                      f"{atol:g}; no file was written")
        return OnnxExport(out, out.stat().st_size, tuple(sample), output, opset, max_diff, pipeline)
    finally:
        model.train(was_training)
