"""The nightly regression: every listed model through pipeline, dumps, locate, diff and gate, with history."""

from qconsist.nightly.across import GpuComparison, compare_across_gpus
from qconsist.nightly.config import ModelEntry, NightlyConfig, load_nightly, parse_nightly
from qconsist.nightly.entry import Attempt, EntryOutcome, EntryTask, guarded_entry, run_entry
from qconsist.nightly.executors import Executor, ExecutorOptions, executor_names, make_executor
from qconsist.nightly.order import HandOut, Order
from qconsist.nightly.package import resolve_package_path
from qconsist.nightly.runner import NightlyResult, night_tasks, run_nightly

__all__ = [
    "Attempt", "EntryOutcome", "EntryTask", "Executor", "ExecutorOptions", "GpuComparison", "HandOut", "ModelEntry", "NightlyConfig",
    "NightlyResult", "compare_across_gpus", "executor_names", "guarded_entry", "load_nightly", "make_executor",
    "night_tasks", "Order", "parse_nightly", "resolve_package_path", "run_entry", "run_nightly",
]
