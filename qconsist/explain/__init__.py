"""Why two runs diverge: the graph transformer responsible (``explain_optimization``) and what onnxruntime
rewrote (``graph_changes``). The onnxruntime upgrade check lives in ``qconsist.upgrade``, the divergence drawn on
the model's graph in Google's Model Explorer in ``qconsist.report.explorer``."""

from qconsist.explain.optimizer import OptimizerExplanation, Probe, explain_optimization
from qconsist.explain.transformers import TransformerActivity, TransformerLog, parse_transformer_log, transformer_activity

__all__ = [
    "OptimizerExplanation", "Probe", "TransformerActivity", "TransformerLog", "explain_optimization",
    "parse_transformer_log", "transformer_activity",
]
