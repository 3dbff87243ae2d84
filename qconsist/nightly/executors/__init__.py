"""Executors of a night's tasks: a small protocol and a registry (``base``); one module per executor.

``local`` (``local.py``) runs the tasks one after another in this process; ``ray`` (``ray.py``) runs them as
Ray tasks on a local Ray or an existing cluster (the ``qconsist[ray]`` extra, imported only when chosen).
"""

from qconsist.nightly.executors.base import Executor, ExecutorOptions, executor_names, make_executor

__all__ = ["Executor", "ExecutorOptions", "executor_names", "make_executor"]
