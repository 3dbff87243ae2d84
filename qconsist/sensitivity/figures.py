"""The figures of one quantized model against the float model, over the probe inputs: every output and part
judged for what it is (``qconsist.compare``: SQNR, cosine, greatest difference; top-1 agreement of class
scores), and, where the inputs have labels, the top-1 accuracy of the class-scores output and its drop from the
float model's. What a target reads (``Figures.value``) and how two models are ordered for a list of targets
(``standing``) are defined here once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from qconsist.compare import compare_outputs
from qconsist.compare.kinds import JudgedOutput, class_scores_output
from qconsist.compare.accuracy import top1
from qconsist.compare.statistics import MEASURED, sqnr_cell
from qconsist.sensitivity.target import Measure, Target
from qconsist.store.serde import serialized


@dataclass
class OutputFigures:
    """One output or part: its label, kind and figures (``integer``: judged by identity, no SQNR)."""

    label: str
    kind: str
    sqnr_db: float
    cosine: float
    max_abs: float
    top1_agreement: float | None = None
    integer: bool = False
    identical_samples: int = 0
    figure: str = MEASURED  # "identical" / "zero-signal": no SQNR measured (``qconsist.compare.statistics``)


@serialized(derived=("accuracy_drop", "worst_sqnr_db"))
@dataclass
class Figures:
    """A quantized model's outputs against the float model's on the probe inputs."""

    samples: int
    outputs: list[OutputFigures]
    top1_agreement: float | None = None  # the class-scores outputs' (the lowest); None: the model has none
    accuracy: float | None = None  # top-1 accuracy of the class-scores output on the labelled samples
    float_accuracy: float | None = None
    labelled: int = 0

    @property
    def accuracy_drop(self) -> float | None:
        """The float model's accuracy minus this one's, in percentage points."""
        if self.accuracy is None or self.float_accuracy is None:
            return None
        return (self.float_accuracy - self.accuracy) * 100.0

    @property
    def worst(self) -> OutputFigures | None:
        """The output or part with the lowest SQNR (integers aside)."""
        judged = [o for o in self.outputs if not o.integer]
        return min(judged, key=lambda o: (o.sqnr_db if not math.isnan(o.sqnr_db) else -math.inf)) if judged else None

    @property
    def worst_sqnr_db(self) -> float:
        worst = self.worst
        return worst.sqnr_db if worst is not None else math.inf

    def value(self, target: Target) -> float:
        """What ``target`` reads of these figures (NaN where there is nothing to read)."""
        m = target.measure
        if m is Measure.TOP1:
            return self.top1_agreement if self.top1_agreement is not None else math.nan
        if m is Measure.ACCURACY_DROP:
            drop = self.accuracy_drop
            return drop if drop is not None else math.nan
        chosen = [o for o in self.outputs if not o.integer and (target.output is None or o.label == target.output)]
        if not chosen:
            return math.nan
        values = [{Measure.SQNR: o.sqnr_db, Measure.COSINE: o.cosine, Measure.MAX_ABS: o.max_abs}[m] for o in chosen]
        values = [v if not math.isnan(v) else (-math.inf if m.lower_bound else math.inf) for v in values]
        return min(values) if m.lower_bound else max(values)

    def meets(self, target: Target) -> bool:
        value = self.value(target)
        if math.isnan(value):
            return False
        return value >= target.bound if target.measure.lower_bound else value <= target.bound

    def meets_all(self, targets: Sequence[Target]) -> bool:
        return all(self.meets(t) for t in targets)

    def describe(self) -> str:
        """"prob (class-scores) 41.4 dB, top-1 100%" — every output and part, short."""
        parts = []
        for o in self.outputs:
            if o.integer:
                parts.append(f"{o.label} ({o.kind}) {o.identical_samples}/{self.samples} identical")
            else:
                parts.append(f"{o.label} ({o.kind}) " + (f"{o.sqnr_db:.1f} dB" if o.figure == MEASURED else sqnr_cell(o.sqnr_db, o.figure)))
        if self.top1_agreement is not None:
            parts.append(f"top-1 agreement {self.top1_agreement:.1%}")
        if self.accuracy is not None:
            parts.append(f"accuracy {self.accuracy:.1%} (float {self.float_accuracy:.1%})")
        return ", ".join(parts)


def standing(figures: Figures, targets: Sequence[Target], baseline: Figures) -> tuple[float, float, float]:
    """How close ``figures`` come to ``targets``, for ordering models (greater is better): the targets met,
    then the share of each target's gap (from ``baseline`` to its bound) closed, summed, then the worst SQNR.
    Without targets: the worst SQNR alone decides."""
    met = sum(1 for t in targets if figures.meets(t))
    closed = 0.0
    for t in targets:
        if figures.meets(t):
            closed += 1.0
            continue
        value, start = figures.value(t), baseline.value(t)
        if math.isnan(value) or math.isnan(start):
            continue
        gap = (t.bound - start) if t.measure.lower_bound else (start - t.bound)
        moved = (value - start) if t.measure.lower_bound else (start - value)
        if math.isinf(moved):
            closed += math.copysign(1.0, moved)
        elif gap > 0:
            closed += moved / gap
    worst = figures.worst_sqnr_db
    return float(met), closed, (worst if not math.isnan(worst) else -math.inf)


def accuracy(outputs: Sequence[Mapping[str, np.ndarray]], target: JudgedOutput, labels: Sequence[int | None]) -> float | None:
    """Top-1 accuracy of ``target`` over the samples that have a label (None: none has)."""
    scored = [(out, label) for out, label in zip(outputs, labels) if label is not None]
    if not scored:
        return None
    correct = sum(int(top1(target.select(out[target.output]))[0] == int(label)) for out, label in scored)
    return correct / len(scored)


def judge(reference: Sequence[Mapping[str, np.ndarray]], candidate: Sequence[Mapping[str, np.ndarray]],
          judged: Sequence[JudgedOutput], labels: Sequence[int | None] | None = None,
          float_accuracy: float | None = None) -> Figures:
    """The figures of ``candidate``'s outputs against ``reference``'s (one step per sample, as ``outputs_of``
    gives them), with accuracy where ``labels`` (one per sample, None where a sample has none) are given."""
    comparison = compare_outputs(reference, candidate, atol=None, rtol=None, judged=judged)
    outputs = [OutputFigures(j.label, j.target.kind_name, j.sqnr_db, j.noise.cosine, j.noise.max_abs, j.top1_agreement,
                             j.integer, j.identical, j.figure) for j in comparison.judgements]
    figures = Figures(samples=comparison.samples, outputs=outputs, top1_agreement=comparison.top1_agreement)
    if labels is not None and any(label is not None for label in labels):
        scores = class_scores_output(judged, "accuracy")
        figures.accuracy = accuracy(candidate, scores, labels)
        figures.float_accuracy = accuracy(reference, scores, labels) if float_accuracy is None else float_accuracy
        figures.labelled = sum(1 for label in labels if label is not None)
    return figures
