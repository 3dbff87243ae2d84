"""Latency of configurations timed side by side: each session's creation and first run (where the CUDA EP
searches its cuDNN algorithms), a few discarded warm-up runs, then timed runs summarised by their median and
spread.

Timings are wall-clock per ``session.run`` on batch-1 samples, host arrays in and out, as an application
calls it. ``side_by_side`` makes every session (timed) and runs it once (timed: the first run), then runs the
warm-up and the timed runs in rounds: one run of each session per round, the order rotated from round to round
so that no session always goes first, every session of a round on the same sample, each round on the next
sample. A load that comes or goes while they are timed (another process, another GPU's work on the same host)
then weighs on every session alike: timing each session after the other, as locate did before, let a burst of
load fall on one configuration's runs only and move the ratio of medians (a 1.04x against a 1.05x bound flipped
to a failure when a CPU-heavy entry ran beside a sub-millisecond model).

Each session's ``LatencyStats`` are its own runs, with their times per round (``rounds_ms``); ``paired_ratios``
compares two sessions timed together round by round: the ratio of their times in each round, summarised by its
median and quartiles (``PairedCost``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from qconsist.errors import ConfigError
from qconsist.inference.session import ort_logged
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.serde import serialized

Sample = dict[str, np.ndarray]


@dataclass(frozen=True)
class LatencyOptions:
    warmup: int = 5
    runs: int = 30

    def __post_init__(self) -> None:
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ConfigError(f"latency warm-up runs must be an integer >= 0, got {self.warmup!r}")
        if not isinstance(self.runs, int) or self.runs < 3:
            raise ConfigError(f"latency runs must be an integer >= 3 (a median needs several), got {self.runs!r}")


@serialized(derived=("spread",))
@dataclass(frozen=True)
class LatencyStats:
    """Milliseconds. ``spread`` is the interquartile range relative to the median. ``rounds_ms``: the timed runs
    in round order when timed side by side (round r of every session timed with it ran at the same moment, on the
    same sample); None for a session timed alone, and in reports written before locate timed side by side."""

    session_ms: float
    first_run_ms: float
    warmup_runs: int
    runs: int
    median_ms: float
    p25_ms: float
    p75_ms: float
    min_ms: float
    max_ms: float
    rounds_ms: tuple[float, ...] | None = None

    @property
    def spread(self) -> float:
        return (self.p75_ms - self.p25_ms) / self.median_ms if self.median_ms > 0 else 0.0


def summarise(times_ms: Sequence[float], session_ms: float, first_run_ms: float, warmup: int,
              rounds: bool = False) -> LatencyStats:
    """The summary of timed runs; ``rounds``: they are one session's runs of rounds timed side by side (kept, in
    order, as ``rounds_ms``)."""
    if len(times_ms) < 3:
        raise ConfigError("a latency summary needs at least 3 timed runs")
    q1, _, q3 = statistics.quantiles(times_ms, n=4, method="inclusive")
    return LatencyStats(
        session_ms=session_ms, first_run_ms=first_run_ms, warmup_runs=warmup, runs=len(times_ms),
        median_ms=statistics.median(times_ms), p25_ms=q1, p75_ms=q3, min_ms=min(times_ms), max_ms=max(times_ms),
        rounds_ms=tuple(times_ms) if rounds else None,
    )


@serialized
@dataclass(frozen=True)
class PairedCost:
    """One session's time over another's (``against``, the fastest) in the same round, over the ``rounds`` they
    were timed side by side: the median ratio and its quartiles."""

    against: str
    rounds: int
    median: float
    p25: float
    p75: float


def paired_ratios(mine: Sequence[float] | None, theirs: Sequence[float] | None, label: str) -> PairedCost | None:
    """A session's times per round (``mine``) over another's (``theirs``, labelled ``label``) round by round; None
    unless both were timed side by side in the same rounds (an older report, a session timed alone)."""
    if mine is None or theirs is None or len(mine) != len(theirs) or len(mine) < 3 or min(theirs) <= 0:
        return None
    ratios = [a / b for a, b in zip(mine, theirs)]
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return PairedCost(label, len(ratios), statistics.median(ratios), q1, q3)


@ort_logged()  # one capture for all its sessions and runs
def side_by_side(makers: Sequence[Callable[[], Any]], samples: Sequence[Sample],
                 options: LatencyOptions = LatencyOptions(), progress: Progress = NULL_PROGRESS,
                 description: str = "latency") -> tuple[list[LatencyStats], list[Any]]:
    """Make a session with each of ``makers`` (timed), run each once (its first run, timed) — then the warm-up
    and the timed runs in rounds, one run of each session per round, the order rotated from round to round (see
    the module docstring). Returns each session's ``LatencyStats`` (with its times per round) and the sessions,
    for further use; ``progress`` advances a task ``description`` once per timed round."""
    if not samples:
        raise ConfigError("latency needs at least one input sample")
    sessions, made_ms, first_ms = [], [], []
    for make in makers:
        start = time.perf_counter()
        session = make()
        made = time.perf_counter()
        session.run(None, samples[0])
        first_ms.append((time.perf_counter() - made) * 1e3)
        made_ms.append((made - start) * 1e3)
        sessions.append(session)
    count = len(sessions)
    for i in range(options.warmup):
        for k in range(count):
            sessions[(i + k) % count].run(None, samples[i % len(samples)])
    times: list[list[float]] = [[] for _ in sessions]
    with progress.task(description, options.runs) as task:
        for r in range(options.runs):
            feed = samples[r % len(samples)]
            for k in range(count):
                index = (r + k) % count
                start = time.perf_counter()
                sessions[index].run(None, feed)
                times[index].append((time.perf_counter() - start) * 1e3)
            task.advance()
    stats = [summarise(t, made, first, options.warmup, rounds=True) for t, made, first in zip(times, made_ms, first_ms)]
    return stats, sessions


def measure_latency(make_session: Callable[[], Any], samples: Sequence[Sample],
                    options: LatencyOptions = LatencyOptions()) -> tuple[LatencyStats, Any]:
    """One session timed alone (``side_by_side`` of one): its stats, without times per round (they pair with no
    other session's), and the session, for further use."""
    (stats,), (session,) = side_by_side([make_session], samples, options)
    return replace(stats, rounds_ms=None), session
