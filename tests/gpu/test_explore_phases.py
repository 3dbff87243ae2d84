"""Every phase of the locate engine on the CPU, the optional ones included: run-to-run, the contention repeats
under a real load (numpy matrix products on the other core) and the per-variant call before the observers close."""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from qconsist.locate.contention import LoadSummary
from qconsist.locate.latency import LatencyOptions
from qconsist.locate.explore import Variant, explore
from qconsist.inference.session import ExecutionOptions


class NumpyLoad:
    """Matrix products in a thread while the block runs (numpy releases the GIL: the load is real)."""

    def __init__(self) -> None:
        self.summary: LoadSummary | None = None
        self._stop = threading.Event()
        self._iterations = 0

    def _work(self) -> None:
        a = np.random.default_rng(21).standard_normal((256, 256))
        while not self._stop.is_set():
            a = np.tanh(a @ a.T / 256)
            self._iterations += 1

    def __enter__(self) -> "NumpyLoad":
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._work)
        self._thread.start()
        while self._iterations == 0:  # the load runs before the block does
            time.sleep(0.001)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.summary = LoadSummary("numpy", self._iterations, time.monotonic() - self._start, os.getpid())


def test_every_phase_runs_in_order_and_is_recorded(nsfw_models, photo_samples):
    variant = Variant("threads=1", ExecutionOptions(intra_op_threads=1))
    seen: list[tuple[str, int, bool]] = []
    loads: list[NumpyLoad] = []

    def load() -> NumpyLoad:
        loads.append(NumpyLoad())
        return loads[-1]

    def on_variant(v: Variant, observer) -> None:  # the observer is still open: its optimized graph is readable
        seen.append((v.label, len(observer.graph.nodes), observer.plan.optimized_path.is_file()))

    phases: dict[str, float] = {}
    reports, results, tagged, load_summary, decision = explore(
        nsfw_models["qdq"], photo_samples[:1], [variant], [], repeats=2, latency=LatencyOptions(0, 3), load=load,
        phases=phases, session_runs=2, on_variant=on_variant)
    assert list(phases) == ["plan", "reference", "run-to-run", "repeats", "comparisons", "latency", "contention", "engines"]
    assert all(seconds >= 0 for seconds in phases.values())
    (report,) = reports
    assert [(o.phase, o.sessions) for o in report.repeats] == [("run-to-run", 2), ("quiet", 2), ("contention", 2)]
    assert report.stable and report.faithful["faithful"] is True  # one intra-op thread: bit-stable, under load too
    assert results == [] and tagged == []
    assert len(loads) == 1 and load_summary == loads[0].summary  # the typed summary (LoadSummary), as the report holds it
    assert load_summary.backend == "numpy" and load_summary.iterations > 0
    assert len(seen) == 1 and seen[0][0] == "threads=1" and seen[0][1] > 100 and seen[0][2]
    assert decision.config == "threads=1"
