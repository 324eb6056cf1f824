"""Exporting qkv models for deployment: the encoder as an ONNX graph (:mod:`qkv.export.onnx`)."""

from __future__ import annotations

from qkv.export.onnx import ExportError, OnnxExport, export_onnx

__all__ = ["export_onnx", "OnnxExport", "ExportError"]
