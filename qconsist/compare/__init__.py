"""The comparison kernel: how two versions of a tensor, a graph's nodes and a model's final outputs differ.

One definition of each idea, used by diff, locate, the fp16 analysis, the pipeline's checks and the gate:
``TensorStats`` (bit-exact equality, ULP distance, integer histogram, tolerance, the mismatch message),
``origins`` (the origin rule), ``top1`` and ``OutputEffect`` (per-sample top-1 for any batch size),
``compare_outputs`` (a model's outputs against a reference within a tolerance).
"""

from qconsist.compare.origin import ObservedGraph, ObservedNode, origins
from qconsist.compare.output import OutputComparison, OutputEffect, batch_rows, compare_outputs, top1
from qconsist.compare.statistics import HISTOGRAM_LIMIT, TensorStats, differing_mask, ulp_distance

__all__ = [
    "HISTOGRAM_LIMIT", "ObservedGraph", "ObservedNode", "OutputComparison", "OutputEffect", "TensorStats",
    "batch_rows", "compare_outputs", "differing_mask", "origins", "top1", "ulp_distance",
]
