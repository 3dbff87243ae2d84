"""Whether the process that wrote a marker (a run directory's ``RUNNING.json``, a night's history row) still runs.

One rule for every reader (``runs list``, ``runs show``, ``runs rm``, the history's abandoned nights):

* a process is named by its pid, its host and, on Linux, its start (the boot's id and the process's start
  time in clock ticks, ``/proc/<pid>/stat`` field 22), so that a pid the kernel gave to another process
  since is not taken for the writer;
* a process that was killed but not yet reaped by its parent (a zombie: ``kill(pid, 0)`` still succeeds)
  is not running;
* a marker written by this very process is being written only while this process has it open (an
  interrupted run in a long-lived process, the tests' harness, is not);
* a marker written on another host cannot be checked from here, and counts as running (never removed).
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any


def host() -> str:
    return socket.gethostname()


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, str] | None:
    """(state letter, start time in clock ticks) of ``pid`` from ``/proc``; ``None`` where there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rpartition(")")[2].split()  # after the command name, which may hold spaces and parentheses
    if len(fields) < 20:
        return None
    return fields[0], fields[19]


def process_start(pid: int | None = None) -> str | None:
    """What tells process ``pid`` (default: this one) from a later process given the same pid: the boot's id and
    its start time; ``None`` where the system does not say (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    stat = _stat(os.getpid() if pid is None else pid)
    return f"{_boot_id()}:{stat[1]}" if stat is not None else None


def identity() -> dict[str, Any]:
    """This process as markers record it."""
    return {"pid": os.getpid(), "host": host(), "process_start": process_start()}


def process_alive(pid: Any, start: Any = None) -> bool:
    """Whether process ``pid`` of this host runs (a zombie does not), and is the one that started at ``start``
    (``process_start``) where that was recorded."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    if sys.platform.startswith("linux") and os.path.isdir("/proc/self"):
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X", "x"):
            return False
        return not isinstance(start, str) or start == f"{_boot_id()}:{stat[1]}"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def writer_running(marker: dict[str, Any], mine: bool) -> tuple[bool, str]:
    """Whether the writer a marker names still runs, and how to say so. ``mine``: this process has the marked
    thing open (asked only when the marker names this process)."""
    pid, where = marker.get("pid"), marker.get("host")
    if isinstance(where, str) and where and where != host():
        return True, f"being written on host {where} (cannot be checked from here)"
    alive = process_alive(pid, marker.get("process_start"))
    if alive and pid == os.getpid():
        alive = mine
    return alive, "being written by a live process" if alive else "interrupted or killed"
