"""``qconsist inspect``: what a run directory or an ONNX model holds, as one typed summary."""

from qconsist.inspect.model import ModelSummary, summarize_model
from qconsist.inspect.run import RunSummary, inspect_path, summarize_run

__all__ = ["ModelSummary", "RunSummary", "inspect_path", "summarize_model", "summarize_run"]
