"""What the float model predicts on a pipeline run's evaluation inputs: its top classes per sample, and its accuracy
where the inputs have labels.

A pipeline whose ``[preprocess]`` is wrong (the channel order swapped, no mean) still quantizes and passes its SQNR
floor: quantized and float model agree on garbage. What the float model predicts is the check a person makes at a
glance (every photograph "class 0 at 1.00", or the labels missed), so ``pipeline run`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qconsist.compare.kinds import OutputKind
from qconsist.inference.session import ExecutionOptions, create_session
from qconsist.sensitivity.source import open_quantized_run


@dataclass(frozen=True)
class Prediction:
    sample: str  # the input set's name of the sample (a file name for images)
    top: tuple[tuple[int, float], ...]  # (class, score), best first
    label: int | None = None


@dataclass
class FloatPredictions:
    """The float model's top classes of one class-scores output on the run's evaluation inputs."""

    output: str
    classes: int
    predictions: list[Prediction] = field(default_factory=list)

    @property
    def labelled(self) -> int:
        return sum(1 for p in self.predictions if p.label is not None)

    @property
    def correct(self) -> int:
        return sum(1 for p in self.predictions if p.label is not None and p.top and p.top[0][0] == p.label)

    def distinct_top1(self) -> int:
        return len({p.top[0][0] for p in self.predictions if p.top})


def float_predictions(run: Path | str, top: int = 3) -> FloatPredictions | None:
    """The float model's ``top`` classes for each evaluation sample of a pipeline ``run`` (its first class-scores
    output, declared or inferred), on the CPU at optimization level disable; None when it has no such output."""
    source = open_quantized_run(run)
    outputs = [j for j in source.judged() if j.kind is OutputKind.CLASS_SCORES and j.axis is None]
    if not outputs:
        return None
    output = outputs[0].output
    inputs = source.inputs("evaluation")
    session = create_session(source.float_model, ExecutionOptions(graph_optimization_level="disable", intra_op_threads=1))
    found = FloatPredictions(output, 0)
    for index in range(len(inputs)):
        scores = np.asarray(session.run([output], inputs.sample(index))[0], dtype=np.float64).reshape(-1)
        found.classes = scores.size
        order = np.argsort(-scores, kind="stable")[:top]
        found.predictions.append(Prediction(str(inputs.names[index]), tuple((int(c), float(scores[c])) for c in order),
                                            inputs.label(index)))
    return found
