"""The nightly regression: every listed model through pipeline, dumps, locate, diff and gate, with history."""

from qconsist.nightly.config import ModelEntry, NightlyConfig, load_nightly, parse_nightly
from qconsist.nightly.package import resolve_package_path
from qconsist.nightly.runner import EntryOutcome, EntryTask, LocalExecutor, NightlyResult, run_entry, run_nightly

__all__ = [
    "EntryOutcome", "ModelEntry", "NightlyConfig", "NightlyResult", "load_nightly", "parse_nightly",
    "resolve_package_path", "run_entry", "run_nightly", "EntryTask", "LocalExecutor",
]
