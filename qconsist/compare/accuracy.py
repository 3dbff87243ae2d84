"""Accuracy against labels, defined once: top-1 and top-5 of a class-scores output, counted a block at a time.

``top1`` is the one top-1 of qconsist (per sample, or per position along a map's class axis): the pipeline's,
the gate's, ``diff``'s and the accuracy's. A sample's scores are its whole class-scores output
(``qconsist.compare.kinds``), flattened; a NaN score is never a class. A label is right within the top ``k`` when fewer than ``k`` classes rank before it:
those with a greater score, and those with an equal score and a smaller index — so top-1 is exactly
``top1(scores) == label``, ties going to the first class as ``argmax`` breaks them. Top-5 is counted only with
more than five classes (with five or fewer every label is within it). ``run`` records it
(``sections.inference.accuracy``), ``diff`` compares two runs' and the samples whose prediction flipped, the gate's
``labels.accuracy`` and the nightly's history (``accuracy.top1``, ``accuracy.top5``) are its figures.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from qconsist.store.sections import Accuracy

TOP_K = 5
NO_LABEL = -1


def top1(values: np.ndarray, class_axis: int | None = None) -> np.ndarray:
    """The one top-1 (a NaN is never the class; ties go to the first class, as ``argmax`` breaks them).

    ``class_axis`` None: the arg-max class of each sample, one per row of the batch axis (one in all for a 0-d or
    1-d output), the sample's scores flattened. ``class_axis`` given (a map's classes at each position, from the
    graph): the arg-max along that axis at every position, shape ``values.shape`` without it."""
    values = np.asarray(values)
    if class_axis is None:
        rows = values.shape[0] if values.ndim >= 2 else 1
        flat = values.reshape(rows, -1)
    else:
        flat = np.moveaxis(values, class_axis, -1)
    if flat.dtype.kind == "f":
        flat = np.where(np.isnan(flat), -np.inf, flat)
    return flat.argmax(axis=-1)


def scores_of(samples: np.ndarray) -> np.ndarray:
    """``(n, classes)`` float64 scores of a block of per-sample outputs ``(n, ...)``, NaN read as -inf."""
    flat = np.asarray(samples).reshape(samples.shape[0], -1)
    values = flat.astype(np.float64)
    return np.where(np.isnan(values), -np.inf, values) if flat.dtype.kind == "f" else values


def label_ranks(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """How many classes rank before each sample's label (``scores`` from ``scores_of``; labels in range)."""
    rows = np.arange(scores.shape[0])
    own = scores[rows, labels][:, None]
    columns = np.arange(scores.shape[1])[None, :]
    before = (scores > own) | ((scores == own) & (columns < labels[:, None]))
    return before.sum(axis=1)


def predictions(samples: np.ndarray) -> np.ndarray:
    """The top-1 class of each sample of a block of per-sample outputs ``(n, ...)`` (``top1``)."""
    samples = np.asarray(samples)
    return top1(samples.reshape(samples.shape[0], -1))


def labels_array(labels: Sequence[int | None]) -> np.ndarray:
    return np.array([NO_LABEL if label is None else int(label) for label in labels], dtype=np.int64)


class AccuracyCounter:
    """Counts right answers of the class-scores output ``output`` over blocks of samples."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.classes = 0
        self.labelled = self.top1 = self.top5 = 0
        self.greatest_label = NO_LABEL

    def add(self, samples: np.ndarray, labels: np.ndarray) -> None:
        """A block of per-sample outputs ``(n, ...)`` and their labels (``NO_LABEL`` where there is none)."""
        scores = scores_of(samples)
        self.classes = max(self.classes, scores.shape[1])
        known = labels != NO_LABEL
        if not known.any():
            return
        self.greatest_label = max(self.greatest_label, int(labels[known].max()))
        fits = known & (labels < scores.shape[1]) & (labels >= 0)
        ranks = label_ranks(scores[fits], labels[fits])
        self.labelled += int(known.sum())
        self.top1 += int((ranks == 0).sum())
        self.top5 += int((ranks < TOP_K).sum())

    @property
    def problem(self) -> str:
        """Why the figures mean nothing ("" when they do): labels beyond the output's classes."""
        if self.greatest_label >= self.classes:
            return (f"the labels go up to class {self.greatest_label}, but output {self.output} scores "
                    f"{self.classes} classes: they are not this model's labels")
        return ""

    def result(self) -> Accuracy | None:
        if not self.labelled or self.problem:
            return None
        return Accuracy(self.output, self.classes, self.labelled, self.top1,
                        self.top5 if self.classes > TOP_K else None)


def accuracy(samples: np.ndarray, labels: Sequence[int | None], output: str) -> Accuracy | None:
    """The accuracy of a whole set of per-sample outputs at once (``AccuracyCounter`` for streams)."""
    counter = AccuracyCounter(output)
    counter.add(np.asarray(samples), labels_array(labels))
    return counter.result()
