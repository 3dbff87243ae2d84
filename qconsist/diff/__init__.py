"""``qconsist diff``: where two runs part — artifacts, calibration tables, tensors, final outputs."""

from qconsist.diff.runs import DiffResult, capture_command, diff_runs

__all__ = ["DiffResult", "capture_command", "diff_runs"]

from qconsist.front import callable_package  # noqa: E402

callable_package(__name__)  # qconsist.diff(run_a, run_b): the top-level call (qconsist.api.diff)
