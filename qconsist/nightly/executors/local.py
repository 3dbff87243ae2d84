"""``local``: the tasks one after another, in this process — nothing else to install (the default)."""

from __future__ import annotations

import re
from typing import Callable, Sequence

from qconsist.environment import fingerprint
from qconsist.nightly.entry import EntryOutcome, EntryTask, guarded_entry
from qconsist.progress import NULL_PROGRESS, Progress


def has_gpu_type(gpu_type: str, names: Sequence[str]) -> bool:
    """Whether a GPU named like ``NVIDIA H100 80GB HBM3`` is of type ``H100`` (a whole word of the name)."""
    pattern = re.compile(rf"(?<![A-Za-z0-9]){re.escape(gpu_type)}(?![A-Za-z0-9])", re.IGNORECASE)
    return any(pattern.search(name) for name in names)


class LocalExecutor:
    name = "local"
    concurrent = False  # one task after another: the hand-out order changes no wall time (the file's order is kept)

    def __init__(self, options=None) -> None:  # ExecutorOptions: nothing to choose
        self.options = options

    def __enter__(self) -> "LocalExecutor":
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def run(self, tasks: Sequence[EntryTask], started: Callable[[EntryTask], None],
            done: Callable[[EntryTask, EntryOutcome], None], progress: Progress = NULL_PROGRESS) -> None:
        gpus = None
        with progress.task("nightly", len(tasks)) as handle:
            for task in tasks:
                started(task)
                if task.gpu_type is not None:
                    gpus = gpus if gpus is not None else [str(g.get("name")) for g in fingerprint().get("gpus") or []]
                    if not has_gpu_type(task.gpu_type, gpus):
                        here = ", ".join(gpus) or "no GPU"
                        done(task, EntryOutcome(
                            model=task.key, status="error", gpu_type=task.gpu_type,
                            error=f"needs a {task.gpu_type} GPU; this machine has {here}: run it with --executor ray "
                                  "on a cluster that has one"))
                        handle.advance()
                        continue
                done(task, guarded_entry(task, progress))
                handle.advance()


EXECUTOR = LocalExecutor
