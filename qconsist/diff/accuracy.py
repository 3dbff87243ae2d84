"""Two runs' accuracy against their labels, the samples whose prediction flipped, and the nodes behind each flip.

Both runs' accuracy is computed from the final outputs they stored and the labels of their sample tables
(``qconsist.compare.accuracy``: the figures ``run`` records, for runs that did not record them too). A sample's
prediction flipped when its top-1 class differs between the runs; for each, the first node that diverges in
that sample and the origin nodes in it come from the tensor comparison, and ``cause`` says what differs between
the runs: the model, the calibration, the options, the batch size, the versions — or nothing, run-to-run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qconsist.compare.accuracy import AccuracyCounter, labels_array, predictions
from qconsist.compare.kinds import class_scores_output, judged_outputs
from qconsist.diff.tensors import SAMPLES_KEPT, TensorComparison
from qconsist.errors import QconsistError, RunStoreError
from qconsist.inputs.record import SampleTable
from qconsist.onnxfile import read_onnx
from qconsist.store.run import Run
from qconsist.store.sections import Accuracy
from qconsist.store.serde import serialized



@dataclass
class FlippedSample:
    """A sample whose top-1 class differs between the runs, and where its tensors first diverge."""

    sample: int
    name: str
    label: int | None
    class_a: int
    class_b: int
    first: str | None = None  # the first node that diverges in this sample (None: no dumps, or none diverges)
    origins: list[str] = field(default_factory=list)
    spans: list[str] = field(default_factory=list)  # spans ending at these nodes (tensors in between unobserved)

    def describe(self) -> str:
        label = f", label {self.label}" if self.label is not None else ""
        where = f"; first diverging node {self.first}" if self.first else ""
        origins = f"; origin {', '.join(self.origins)}" if self.origins else ""
        spans = f"; span ending at {', '.join(self.spans)}" if self.spans else ""
        return f"sample {self.sample} ({self.name}{label}): class {self.class_a} -> {self.class_b}{where}{origins}{spans}"


@serialized(derived=("change", "summary"))
@dataclass
class AccuracyChange:
    """Both runs' accuracy on the class-scores output ``output``, and the flipped predictions."""

    output: str
    a: Accuracy | None
    b: Accuracy | None
    flipped: list[FlippedSample] = field(default_factory=list)  # the first SAMPLES_KEPT
    flipped_count: int = 0
    cause: str = "run-to-run"  # what differs between the runs, or run-to-run
    traced: bool = False  # the runs had tensor dumps: flips carry their first node and origins

    @property
    def change(self) -> float | None:
        if self.a is None or self.b is None or self.a.top1_share is None or self.b.top1_share is None:
            return None
        return self.b.top1_share - self.a.top1_share

    def origins(self) -> list[tuple[str, int]]:
        """Origin nodes of the flipped samples, with how many flips each is an origin of, most first."""
        return Counter(o for f in self.flipped for o in f.origins).most_common()

    def summary(self) -> str:
        def share(accuracy: Accuracy | None) -> str:
            value = accuracy.top1_share if accuracy is not None else None
            return f"{100 * value:.2f}%" if value is not None else "unknown"

        text = f"accuracy {share(self.a)} -> {share(self.b)}"
        if self.change is not None:
            text += f" ({100 * self.change:+.2f} points)"
        if not self.flipped_count:
            return f"{text}: no prediction flipped"
        text += f": {self.flipped_count} prediction{'s' if self.flipped_count != 1 else ''} flipped"
        origins = self.origins()
        if origins:
            return text + f"; origin {', '.join(name for name, _ in origins[:3])} ({self.cause})"
        if not self.traced:
            return text + f" ({self.cause}; dump both runs with --dump to name the node behind them)"
        return text + f" ({self.cause})"


def class_scores(a: Run, b: Run) -> str | None:
    """The class-scores output the runs are judged on: as a run recorded it, else read from the model it ran."""
    for run in (a, b):
        if run.inference.accuracy is not None:
            return run.inference.accuracy.output
    for run in (a, b):
        try:
            path = run.ran_model()
            if path is None:
                continue
            return class_scores_output(judged_outputs(read_onnx(path, error=RunStoreError))).output
        except QconsistError:
            continue
    return None


class Predictions:
    """Top-1 classes and accuracy of one run, gathered block by block while the outputs are compared."""

    def __init__(self, position: int, output: str, table: SampleTable, samples: int) -> None:
        self.position = position
        self.counter = AccuracyCounter(output)
        self.labels = labels_array(table.labels) if len(table.labels) == samples else np.full(samples, -1)
        self.classes = np.zeros(samples, dtype=np.int64)

    def add(self, start: int, block: np.ndarray) -> None:
        """A block ``(n, *sample shape)`` of the class-scores output from sample ``start``."""
        self.classes[start:start + block.shape[0]] = predictions(block)
        self.counter.add(block, self.labels[start:start + block.shape[0]])

    @property
    def has_labels(self) -> bool:
        return bool((self.labels >= 0).any())


def compare_predictions(output: str, a: Predictions, b: Predictions, names: list[str],
                        tensors: TensorComparison | None, cause: str) -> AccuracyChange:
    """The accuracy change between two runs and every flipped prediction with the nodes behind it."""
    flipped = np.flatnonzero(a.classes != b.classes)
    change = AccuracyChange(output, a.counter.result(), b.counter.result(), flipped_count=int(flipped.size), cause=cause,
                            traced=tensors is not None)
    traces = {t.sample: t for t in tensors.traces} if tensors is not None else {}
    for sample in flipped[:SAMPLES_KEPT].tolist():
        label = int(a.labels[sample]) if a.labels[sample] >= 0 else None
        trace = traces.get(sample)
        change.flipped.append(FlippedSample(sample, names[sample] if sample < len(names) else str(sample), label,
                                            int(a.classes[sample]), int(b.classes[sample]),
                                            trace.first if trace else None, list(trace.origins) if trace else [],
                                            list(trace.spans) if trace else []))
    return change


def cause(artifacts_stage: str | None, calibration_changed: bool, options: list[str], batch: tuple[int, int],
          numerics: list[Any]) -> str:
    """What differs between two runs (the first thing that can change numerics), or ``run-to-run``."""
    if artifacts_stage:
        return "the models differ" if artifacts_stage == "model" else f"the {artifacts_stage} models differ"
    if calibration_changed:
        return "the calibration differs"
    if batch[0] != batch[1]:
        return f"batch size {batch[0]} vs {batch[1]}"
    if options:
        return f"options differ: {options[0]}"
    if numerics:
        kernels = next((c for c in numerics if getattr(c, "name", None) == "instruction_set"), None)
        if kernels is not None and len(numerics) == 1:
            return f"ran different CPU kernels: {kernels.old} vs {kernels.new}"
        return f"versions differ: {numerics[0]}"
    return "run-to-run"
