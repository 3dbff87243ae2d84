"""What an executor is, its options, and the registry that finds them.

An executor module (``qconsist/nightly/executors/<name>.py``) defines one class ``EXECUTOR`` with a ``name``
and ``__init__(options: ExecutorOptions)`` that satisfies ``Executor``; the registry finds every such module
in this package (importing a module must stay cheap: heavy libraries are imported in ``run``), so adding an
executor is one new file.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence, runtime_checkable

from qconsist.discovery import discover
from qconsist.errors import ConfigError
from qconsist.nightly.entry import EntryOutcome, EntryTask
from qconsist.progress import NULL_PROGRESS, Progress

MAX_RETRIES = 10


@runtime_checkable
class Executor(Protocol):
    """Runs the night's tasks. Used as a context manager around the night: entering it gets what it needs
    (a Ray connection), so that a missing one fails before the night starts; leaving it lets go. ``run`` calls
    ``started(task)`` when a task is handed out and ``done(task, outcome)`` with each outcome as it arrives,
    both in the head process (which records them in order). On Ctrl-C it cancels what is outstanding and lets
    ``KeyboardInterrupt`` through. It hands tasks out in the order it is given them; ``concurrent`` (a class
    attribute; absent: false) says whether it runs several at once, so that the night gives them longest first
    (``qconsist.nightly.order``)."""

    name: str

    def __enter__(self) -> "Executor": ...

    def __exit__(self, *exc_info: object) -> None: ...

    def run(self, tasks: Sequence[EntryTask], started: Callable[[EntryTask], None],
            done: Callable[[EntryTask, EntryOutcome], None], progress: Progress = NULL_PROGRESS) -> None: ...


@dataclass(frozen=True)
class ExecutorOptions:
    """Which executor runs the night, and how.

    ``address``: (ray) an existing Ray cluster (``auto``, ``<head>:6379``, ``ray://<head>:10001``); ``None``
    starts a local Ray in this process, with ``num_cpus``/``num_gpus``/``resources`` where given (else what
    Ray detects). ``max_retries``: (ray) how many times an entry whose worker was lost is run again.
    """

    name: str = "local"
    address: str | None = None
    max_retries: int = 2
    num_cpus: int | None = None
    num_gpus: int | None = None
    resources: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = executor_names()
        if self.name not in names:
            raise ConfigError(f"unknown `executor` {self.name!r}; choose one of: {', '.join(names)}")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or not 0 <= self.max_retries <= MAX_RETRIES:
            raise ConfigError(f"`max_retries` must be a whole number from 0 to {MAX_RETRIES}, got {self.max_retries!r}")
        if self.name != "ray" and (self.address is not None or self.num_cpus is not None or self.num_gpus is not None or self.resources):
            raise ConfigError("`address` (and a local Ray's CPUs, GPUs and resources) are options of `executor` ray")
        if self.address is not None and (self.num_cpus is not None or self.num_gpus is not None or self.resources):
            raise ConfigError("a cluster at `address` declares its own CPUs, GPUs and resources; give them to `ray start`")
        for label, value in (("num_cpus", self.num_cpus), ("num_gpus", self.num_gpus)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"`{label}` must be a whole number >= 0, got {value!r}")
        for key, value in self.resources.items():
            if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"resource {key!r} must be a positive amount, got {value!r}")


@functools.lru_cache(maxsize=1)
def _registry() -> dict[str, type]:
    return {executor.name: executor for _, executor in discover(__name__.rpartition(".")[0], "EXECUTOR")}


def executor_names() -> list[str]:
    """The executors' names, ``local`` first."""
    return sorted(_registry(), key=lambda name: (name != "local", name))


def make_executor(options: ExecutorOptions | None = None) -> Executor:
    options = options or ExecutorOptions()
    return _registry()[options.name](options)
