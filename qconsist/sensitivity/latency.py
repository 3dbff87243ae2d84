"""What keeping nodes in float costs at run time: the float, all-quantized and proposed models timed side by side
on the chosen execution provider.

The three sessions are made first; each runs once (the CUDA EP's algorithm search); then the warm-up and the timed
runs are interleaved — one run of each model in turn, the order rotating, each on the next sample — so
that a machine that slows down or speeds up meanwhile weighs on every model alike. Medians of ``runs`` timed
runs each (``qconsist.locate.latency.summarise``); the cost is the proposed model's median over the all-quantized
model's.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Sequence

from qconsist.locate.latency import LatencyOptions
from qconsist.locate.latency import side_by_side as timed_side_by_side
from qconsist.inference.session import ExecutionOptions, create_session, ort_logged
from qconsist.inputs import InputSet
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.sensitivity.result import Latency


@ort_logged()
def side_by_side(models: Sequence[Path], execution: ExecutionOptions, inputs: InputSet,
                 options: LatencyOptions = LatencyOptions(), progress: Progress = NULL_PROGRESS) -> list:
    """``LatencyStats`` of each model, timed interleaved (``locate.latency.side_by_side``: the module docstring)."""
    samples = [inputs.sample(i) for i in range(min(len(inputs), 8))]
    stats, _ = timed_side_by_side([partial(create_session, model, execution) for model in models], samples, options,
                                  progress, "timing")
    return stats


def latency_cost(float_model: Path, quantized: Path, proposed: Path, execution: ExecutionOptions, inputs: InputSet,
                 options: LatencyOptions = LatencyOptions(), progress: Progress = NULL_PROGRESS) -> Latency:
    """The three models timed side by side (see the module docstring)."""
    f, q, p = side_by_side([float_model, quantized, proposed], execution, inputs, options, progress)
    return Latency(provider=execution.provider, runs=options.runs, warmup=options.warmup, float_ms=f.median_ms,
                   quantized_ms=q.median_ms, proposed_ms=p.median_ms, quantized_spread=q.spread, proposed_spread=p.spread)
