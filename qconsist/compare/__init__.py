"""The comparison kernel: how two versions of a tensor, a graph's nodes and a model's final outputs differ.

One definition of each idea, used by diff, locate, the fp16 analysis, the pipeline's checks and the gate:
``TensorStats`` (bit-exact equality, ULP distance, integer histogram, tolerance, the mismatch message),
``origins`` (the origin rule), ``top1`` and ``OutputEffect`` (per-sample top-1 for any batch size),
``compare_outputs`` (a model's outputs against a reference within a tolerance, each output judged for what it
is: ``kinds``).
"""

from qconsist.compare.kinds import JudgedOutput, OutputKind, class_scores_output, judged_outputs, parse_kinds
from qconsist.compare.origin import UNOBSERVED, ObservedGraph, ObservedNode, Proof, origins
from qconsist.compare.output import OutputComparison, OutputEffect, OutputJudgement, batch_rows, compare_outputs, top1
from qconsist.compare.statistics import HISTOGRAM_LIMIT, TensorStats, differing_mask, ulp_distance

__all__ = [
    "HISTOGRAM_LIMIT", "JudgedOutput", "ObservedGraph", "ObservedNode", "OutputComparison", "OutputEffect",
    "OutputJudgement", "OutputKind", "Proof", "UNOBSERVED", "TensorStats", "batch_rows", "class_scores_output", "compare_outputs",
    "differing_mask", "judged_outputs", "origins", "parse_kinds", "top1", "ulp_distance",
]
