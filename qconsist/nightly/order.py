"""The order a night's tasks are handed out in: longest first where they run at once, else the file's.

An executor that runs several tasks at once (``ray``) starts them in the order it is given them, as resources
free up. Handed out in the file's order, the longest entry may start last and set the end of the night alone
(the two-H200 night: 218 s, where list scheduling of the same durations longest first gives 170 s). Longest
first (LPT list scheduling: each free slot takes the longest task left) ends within 4/3 of the best possible
order, and needs only each task's length: here each history key's last recorded duration, the task's own wall
seconds of its most recent entry that reached a verdict (``History.last_seconds``; a history older than schema
version 3 has none). It assumes a task's length does not depend on what runs beside it (one entry per GPU); on
a CPU machine whose cores other processes share it may lose (docs/nightly.md: 1.20 here), and
``--order file`` (``run_nightly(order=Order.FILE)``) keeps the file's order.

A task with no known duration (a new entry, a new GPU type, a history without durations) is handed out
first, in the file's order: it may be the longest, and the one thing longest first must avoid is a long task
handed out last; a short one handed out early only takes a slot for its own few seconds. Ties keep the
file's order.

The local executor runs one task after another: the order changes nothing of its wall time, so it keeps the
file's order (its logs and progress lines read as the file does). Outcomes are recorded, and results list
their entries, in the file's order whatever the hand-out order (``qconsist.nightly.runner``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import Enum
from typing import Sequence

from qconsist.history import History
from qconsist.nightly.entry import EntryTask
from qconsist.report import handout_text
from qconsist.store.serde import serialized


class Order(str, Enum):
    LONGEST_FIRST = "longest-first"  # by each history key's last recorded duration; unknown ones first
    FILE = "file"  # the nightly file's order


@serialized
@dataclass(frozen=True)
class HandOut:
    """The order a night's tasks were handed out in (history keys), the rule and why, and for longest first the
    durations it used: each key's last recorded seconds (``None``: none recorded)."""

    rule: Order
    order: list[str]
    reason: str = ""
    durations: dict[str, float | None] = field(default_factory=dict)

    def __str__(self) -> str:
        return handout_text(self.to_json())


def hand_out(tasks: Sequence[EntryTask], history: History, night_id: str, rule: Order,
             reason: str = "") -> tuple[list[EntryTask], HandOut]:
    """``tasks`` (in the file's order) in the order to hand them out under ``rule``, and what the night records
    of it. Longest first: tasks with no recorded duration first (file order), then by last duration, longest
    first (ties: file order)."""
    if rule is Order.FILE:
        return list(tasks), HandOut(rule, [t.key for t in tasks], reason)
    durations = {t.key: history.last_seconds(t.key, before=night_id) for t in tasks}
    unknown = [t for t in tasks if durations[t.key] is None]
    known = sorted((t for t in tasks if durations[t.key] is not None), key=lambda t: -float(durations[t.key] or 0.0))
    ordered = unknown + known  # sorted() is stable: equal durations keep the file's order
    return ordered, HandOut(rule, [t.key for t in ordered], reason, durations)


def list_schedule(seconds: Sequence[float], slots: int) -> float:
    """The wall time of tasks lasting ``seconds``, handed out in that order to ``slots`` workers, each taking the
    next task as soon as it is free (what a Ray of ``slots`` CPUs does with tasks of one CPU each)."""
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    free = [0.0] * slots
    for length in seconds:
        heapq.heapreplace(free, free[0] + length)
    return max(free)
