"""Latency of a real CPU session: first run, warm-up, median and spread."""

from __future__ import annotations

import pytest

from qconsist.errors import ConfigError
from qconsist.locate.latency import LatencyOptions, LatencyStats, measure_latency, summarise
from qconsist.inference.session import ExecutionOptions, create_session


def test_measure_latency_on_open_nsfw(nsfw_models, photo_samples):
    stats, session = measure_latency(lambda: create_session(nsfw_models["qdq"], ExecutionOptions()),
                                     photo_samples, LatencyOptions(warmup=2, runs=6))
    assert stats.runs == 6 and stats.warmup_runs == 2
    assert stats.session_ms > 0 and stats.first_run_ms > 0
    assert stats.min_ms <= stats.p25_ms <= stats.median_ms <= stats.p75_ms <= stats.max_ms
    assert stats.spread == pytest.approx((stats.p75_ms - stats.p25_ms) / stats.median_ms)
    assert LatencyStats.from_json(stats.to_json()) == stats
    assert session.get_providers()[0] == "CPUExecutionProvider"


def test_summary_of_known_times():
    stats = summarise([4.0, 1.0, 3.0, 2.0, 5.0], session_ms=7.0, first_run_ms=9.0, warmup=1)
    assert (stats.median_ms, stats.p25_ms, stats.p75_ms, stats.min_ms, stats.max_ms) == (3.0, 2.0, 4.0, 1.0, 5.0)
    assert stats.spread == pytest.approx(2.0 / 3.0)


@pytest.mark.parametrize("warmup, runs, message", [
    (-1, 10, r"warm-up runs must be an integer >= 0, got -1"),
    (0, 2, r"latency runs must be an integer >= 3 \(a median needs several\), got 2"),
])
def test_latency_options_are_validated(warmup, runs, message):
    with pytest.raises(ConfigError, match=message):
        LatencyOptions(warmup, runs)
