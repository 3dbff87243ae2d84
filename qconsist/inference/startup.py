"""Where a run's start-up goes: the main thread's phases from the process's start to the first step, and the
parts done beside them in threads, said in one line under ``-v`` (``qconsist -v run`` logs ``start-up: …``).

The main thread's phases follow each other (``mark`` closes the phase since the last mark), so they add up to the
start-up; a part done beside them (``beside``) is timed in its thread, and the main thread's wait for it, if it had
to wait, is a phase of its own (``wait``): what is on the critical path is what the main thread did or waited for.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Executor, Future, wait
from typing import Any, Callable


def process_age() -> float | None:
    """Seconds since this process started (Linux: ``/proc/self/stat``, to the clock tick), else None."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time after boot, in ticks
        return max(time.clock_gettime(time.CLOCK_BOOTTIME) - started, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Startup:
    """The start-up's clock: ``mark`` the end of each main-thread phase, run parts ``beside``, ``wait`` for them."""

    def __init__(self, begun: float | None = None, imported: float | None = None) -> None:
        """``begun``: when the clock's first phase began (``time.perf_counter``; default now); ``imported``: when
        the command line had been imported (its options parsed from then to ``begun``)."""
        now = time.perf_counter()
        begun = now if begun is None else begun
        age = process_age()
        self.origin = now - age if age is not None else None  # the process's start on this clock
        self.begun = begun  # the command's function, or run_inference where it made this clock
        self.run_begun = begun  # run_inference's start (set by it)
        self._last = begun
        self._lock = threading.Lock()
        self.phases: dict[str, float] = {}  # main thread, in order
        self.beside_parts: dict[str, float] = {}  # threads, in the order they finished
        if self.origin is not None and imported is not None and self.origin <= imported <= begun:
            self.phases["process"] = imported - self.origin  # the interpreter and the command line's imports
            self.phases["options"] = begun - imported  # typer's parsing, the options' objects
        elif self.origin is not None:  # the interpreter, the command line's imports, its options
            self.phases["process"] = max(begun - self.origin, 0.0)

    def mark(self, name: str) -> None:
        """The main thread's phase ``name`` ends now (added to an earlier phase of that name)."""
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._last
        self._last = now

    def beside(self, name: str, function: Callable[..., Any], *args: Any, pool: Executor,
               after: Future | None = None) -> Future:
        """``function(*args)`` in a thread of ``pool`` beside the main thread, once ``after`` is done (whatever its
        outcome), timed as part ``name`` from then."""
        def timed() -> Any:
            if after is not None:
                wait([after])
            start = time.perf_counter()
            try:
                return function(*args)
            finally:
                with self._lock:
                    self.beside_parts[name] = self.beside_parts.get(name, 0.0) + time.perf_counter() - start
        return pool.submit(timed)

    def wait(self, name: str, future: Future) -> Any:
        """``future``'s result (its error raised), the main thread's wait for it timed as phase ``wait NAME``."""
        self.mark_pending()
        try:
            return future.result()
        finally:
            self.mark(f"wait {name}")

    def mark_pending(self) -> None:
        """Close the phase being timed as ``other`` where nothing named it (a wait starts a new phase)."""
        if time.perf_counter() - self._last > 0.0005:
            self.mark("other")
        else:
            self._last = time.perf_counter()

    def total(self) -> float:
        """Seconds from the process's start (where known, else the library's) to now."""
        return time.perf_counter() - (self.origin if self.origin is not None else self.begun)

    def describe(self) -> str:
        """The log line's text: the total, then each main-thread phase, then the parts done beside them."""
        now = time.perf_counter()
        since = "the process's start" if self.origin is not None else "the library's start"
        # a wait that did not wait (the part was done) is left out
        phases = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.phases.items()
                           if seconds >= 0.005 or not name.startswith("wait "))
        text = (f"{self.total():.2f} s from {since} to the first step ({now - self.run_begun:.2f} s of it from "
                f"run_inference's start): {phases}")
        with self._lock:
            parts = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.beside_parts.items())
        return text + (f"; beside: {parts}" if parts else "")
