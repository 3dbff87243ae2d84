"""``qconsist diff``: where two runs part — artifacts, calibration tables, tensors, final outputs."""

from qconsist.diff.runs import DiffResult, capture_command, diff_runs

__all__ = ["DiffResult", "capture_command", "diff_runs"]
