"""Inference: models prepared to run fast in float32, bfloat16 or int8 (:func:`for_inference`).

* :mod:`qkv.inference.support`: what the CPU supports, read at run time.
* :mod:`qkv.inference.linear`: oneDNN linear maps with the activation fused (float32, bfloat16).
* :mod:`qkv.inference.int8`: int8 dynamic quantisation with per-channel weight scales and smoothing.
* :mod:`qkv.inference.calibration`: the fixed calibration text and the input maxima int8 smooths by.
* :mod:`qkv.inference.prepare`: :func:`for_inference` and the precision checks.
"""

from qkv.inference.calibration import calibration_sequences
from qkv.inference.int8 import Int8Linear
from qkv.inference.linear import InferenceLinear
from qkv.inference.prepare import (INT8_KINDS, LINEAR_KINDS, PRECISIONS, SMOOTHING, InferenceFeedForward,
                                   check_precision, for_inference, for_inference_calibrated,
                                   inference_precision)
from qkv.inference.support import cpu_features, precision_unsupported

__all__ = ["for_inference", "for_inference_calibrated", "check_precision", "inference_precision", "calibration_sequences", "PRECISIONS",
           "INT8_KINDS", "LINEAR_KINDS", "SMOOTHING",
           "InferenceLinear", "Int8Linear", "InferenceFeedForward", "cpu_features", "precision_unsupported"]
