"""Latency of one configuration: the first run (where the CUDA EP searches its cuDNN algorithms), a few
discarded warm-up runs, then timed runs summarised by their median and spread.

Timings are wall-clock per ``session.run`` on batch-1 samples, host arrays in and out, as an application
calls it. Each timed run takes the next sample in turn so no single input is favoured.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from qconsist.errors import ConfigError
from qconsist.inference.session import ort_logged
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
    """Milliseconds. ``spread`` is the interquartile range relative to the median."""

    session_ms: float
    first_run_ms: float
    warmup_runs: int
    runs: int
    median_ms: float
    p25_ms: float
    p75_ms: float
    min_ms: float
    max_ms: float

    @property
    def spread(self) -> float:
        return (self.p75_ms - self.p25_ms) / self.median_ms if self.median_ms > 0 else 0.0


def summarise(times_ms: Sequence[float], session_ms: float, first_run_ms: float, warmup: int) -> LatencyStats:
    if len(times_ms) < 3:
        raise ConfigError("a latency summary needs at least 3 timed runs")
    q1, _, q3 = statistics.quantiles(times_ms, n=4, method="inclusive")
    return LatencyStats(
        session_ms=session_ms, first_run_ms=first_run_ms, warmup_runs=warmup, runs=len(times_ms),
        median_ms=statistics.median(times_ms), p25_ms=q1, p75_ms=q3, min_ms=min(times_ms), max_ms=max(times_ms),
    )


@ort_logged()  # one capture for all its sessions and runs
def time_session(session: Any, samples: Sequence[Sample], options: LatencyOptions = LatencyOptions(),
                 session_ms: float = 0.0) -> LatencyStats:
    """Time a session that has not run yet: its first run, the warm-up runs, then the timed runs."""
    if not samples:
        raise ConfigError("latency needs at least one input sample")
    start = time.perf_counter()
    session.run(None, samples[0])
    first_ms = (time.perf_counter() - start) * 1e3
    for i in range(options.warmup):
        session.run(None, samples[i % len(samples)])
    times = []
    for i in range(options.runs):
        feed = samples[i % len(samples)]
        start = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - start) * 1e3)
    return summarise(times, session_ms, first_ms, options.warmup)


@ort_logged()  # one capture for all its sessions and runs
def measure_latency(make_session: Callable[[], Any], samples: Sequence[Sample],
                    options: LatencyOptions = LatencyOptions()) -> tuple[LatencyStats, Any]:
    """Create a session with ``make_session()`` (timed too), time it, and return it for further use."""
    start = time.perf_counter()
    session = make_session()
    session_ms = (time.perf_counter() - start) * 1e3
    return time_session(session, samples, options, session_ms), session
