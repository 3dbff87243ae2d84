"""Progress reporting for long work. The library reports; the CLI decides whether and how to show it.

Library code takes an optional ``Progress`` and calls ``task(description, total)`` to get a handle with
``advance(n)``; the default does nothing, so the library never prints. ``ProgressLines`` is the one a caller may
give to see the work go by as plain lines (the CLI does where no one watches a terminal: CI, a pipe).
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol


class TaskHandle(Protocol):
    def advance(self, amount: int = 1) -> None: ...


class Progress(Protocol):
    def task(self, description: str, total: int | None) -> "contextmanager[TaskHandle]": ...


class _NullHandle:
    def advance(self, amount: int = 1) -> None:
        return None


class NullProgress:
    """Reports nothing."""

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[TaskHandle]:
        yield _NullHandle()


NULL_PROGRESS = NullProgress()


# --- plain lines -------------------------------------------------------------------------------------------------
# Progress as plain lines, for output that no one watches live: a CI log, a file, a pipe.
#
# A bar redrawn in place means nothing there, and printing nothing until the end of a 3-minute nightly looks like a
# hang. ``ProgressLines`` (a ``qconsist.progress.Progress``) prints one line every ``interval`` seconds of work while
# a task is open, as pytest and pip do: how long the work has run, then every open task, what it is, how far it
# got and the time left, estimated from the mean time per item so far (known from the first item done)::
#
#     progress 0:00:20: nightly 1/5 (20%), ETA 0:01:20; stage quantize 0:00:12; calibrating 40/100 (40%), ETA 0:00:18
#
# A task shorter than ``interval`` prints nothing. The lines go to stderr: stdout keeps the result.

INTERVAL = 10.0  # seconds of work between two lines


def _interval() -> float:
    return INTERVAL  # read when a ProgressLines is made (tests shorten it)


def clock_text(seconds: float) -> str:
    seconds = max(int(round(seconds)), 0)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@dataclass
class _Task:
    description: str
    total: int | None
    started: float
    done: int = 0

    def describe(self, now: float) -> str:
        elapsed = now - self.started
        if not self.total:
            return f"{self.description} {clock_text(elapsed)}" + (f", {self.done} done" if self.done else "")
        eta = clock_text(elapsed / self.done * (self.total - self.done)) if self.done else "unknown"
        return f"{self.description} {self.done}/{self.total} ({100 * self.done // self.total}%), ETA {eta}"


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class ProgressLines:
    """Plain progress lines (see the module docstring). ``write`` takes one line; ``clock`` gives seconds."""

    def __init__(self, write: Callable[[str], None] = _stderr, clock: Callable[[], float] = time.monotonic,
                 interval: float | None = None) -> None:
        interval = _interval() if interval is None else interval
        self._write, self._clock, self._interval = write, clock, interval
        self._tasks: list[_Task] = []
        self._lock = threading.Lock()
        self._started: float | None = None  # the first task's start: the lines' time of work
        self._due = time.monotonic() + interval  # when the next line is due (real time, whatever ``clock``)
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def line(self) -> str | None:
        """The line for the tasks open now (None when none is)."""
        now = self._clock()
        with self._lock:
            if not self._tasks or self._started is None:
                return None
            return f"progress {clock_text(now - self._started)}: " + "; ".join(t.describe(now) for t in self._tasks)

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[object]:
        record = _Task(description, total, self._clock())
        lock = self._lock

        class Handle:
            def advance(self, amount: int = 1) -> None:
                with lock:
                    record.done += amount

        with lock:
            self._tasks.append(record)
            if self._started is None:
                self._started = record.started
            if self._thread is None:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._tick, args=(self._stop,), name="qconsist-progress", daemon=True)
                self._thread.start()
        try:
            yield Handle()
        finally:
            thread = None
            with lock:
                self._tasks.remove(record)
                if not self._tasks and self._thread is not None:
                    thread, self._thread = self._thread, None
                    self._stop.set()  # type: ignore[union-attr]
            if thread is not None and thread is not threading.current_thread():
                thread.join()

    def _tick(self, stop: threading.Event) -> None:
        """While a task is open: a line every ``interval`` seconds, counted across tasks (stages of a few
        seconds each still give a line every ``interval``)."""
        while not stop.wait(max(self._due - time.monotonic(), 0.0)):
            line = self.line()
            self._due = time.monotonic() + self._interval
            if line is not None and not stop.is_set():
                self._write(line)
