"""Latency of real CPU sessions: first run, warm-up, median and spread; side by side in rotating rounds."""

from __future__ import annotations

import statistics

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
    assert stats.rounds_ms is None  # timed alone: nothing to pair with


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


class _Logged:
    """A real session whose runs are logged: (name, index of the sample it ran on)."""

    def __init__(self, session, name: str, samples: list, log: list) -> None:
        self.session, self.name, self.samples, self.log = session, name, samples, log

    def run(self, outputs, feed):
        self.log.append((self.name, next(i for i, s in enumerate(self.samples) if s is feed)))
        return self.session.run(outputs, feed)


def test_side_by_side_runs_in_rotating_rounds_on_one_sample_per_round(tmp_path):
    """Each session: made, run once; then the warm-up and the timed runs in rounds — one run of each per round, all
    on the same sample, the first of the round rotating — and its own times kept per round."""
    import numpy as np
    from onnx_builders import small_convnet
    from progress_recorder import Recorder

    from qconsist.locate.latency import side_by_side

    model = small_convnet(tmp_path / "convnet.onnx")
    rng = np.random.default_rng(11)
    samples = [{"input": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(2)]
    log: list = []
    makers = [lambda name=name: _Logged(create_session(model, ExecutionOptions(intra_op_threads=1)), name, samples, log)
              for name in "abc"]
    progress = Recorder()
    stats, sessions = side_by_side(makers, samples, LatencyOptions(warmup=2, runs=4), progress)
    first_runs, rounds = log[:3], [log[i:i + 3] for i in range(3, len(log), 3)]
    assert first_runs == [("a", 0), ("b", 0), ("c", 0)]
    assert rounds == [
        [("a", 0), ("b", 0), ("c", 0)], [("b", 1), ("c", 1), ("a", 1)],  # warm-up
        [("a", 0), ("b", 0), ("c", 0)], [("b", 1), ("c", 1), ("a", 1)], [("c", 0), ("a", 0), ("b", 0)],
        [("a", 1), ("b", 1), ("c", 1)],  # timed
    ]
    assert progress.tasks == [["latency", 4, 4]]
    assert [s.name for s in sessions] == ["a", "b", "c"]
    for s in stats:
        assert s.runs == 4 and s.warmup_runs == 2 and s.session_ms > 0 and s.first_run_ms > 0
        assert len(s.rounds_ms) == 4 and s.median_ms == statistics.median(s.rounds_ms)
        assert LatencyStats.from_json(s.to_json()) == s
    with pytest.raises(ConfigError, match="latency needs at least one input sample"):
        side_by_side(makers, [], LatencyOptions(0, 3))


def test_a_report_written_before_side_by_side_timing_loads_without_rounds():
    old = {"session_ms": 7.0, "first_run_ms": 9.0, "warmup_runs": 5, "runs": 30, "median_ms": 3.0, "p25_ms": 2.0,
           "p75_ms": 4.0, "min_ms": 1.0, "max_ms": 5.0, "spread": 0.667}
    stats = LatencyStats.from_json(old)
    assert stats.rounds_ms is None and stats.median_ms == 3.0
