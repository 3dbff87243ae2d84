"""Accuracy against labels, defined once: checked against an independent numpy computation (argsort ranks),
ties, NaN scores, missing labels and labels that are not the model's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qconsist.compare import top1
from qconsist.compare.accuracy import AccuracyCounter, accuracy, labels_array, predictions


def _independent(scores: np.ndarray, labels: list[int | None], k: int) -> tuple[int, int]:
    """(labelled, right within the top k) by a stable descending sort (ties: the lower class first), NaN last."""
    labelled = right = 0
    for row, label in zip(scores.reshape(scores.shape[0], -1), labels):
        if label is None:
            continue
        labelled += 1
        keys = np.where(np.isnan(row), -np.inf, row.astype(np.float64))
        order = sorted(range(len(keys)), key=lambda c: (-keys[c], c))
        right += label in order[:k]
    return labelled, right


@settings(max_examples=60, deadline=None)
@given(classes=st.integers(2, 12), samples=st.integers(1, 40), seed=st.integers(0, 2**16),
       ties=st.booleans(), nans=st.booleans())
def test_top1_and_top5_equal_an_independent_count(classes, samples, seed, ties, nans):
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(samples, 1, classes)).astype(np.float32)
    if ties:
        scores = np.round(scores)  # many equal scores: ties go to the first class
    if nans:
        scores[rng.random(scores.shape) < 0.1] = np.nan
    labels = [None if rng.random() < 0.2 else int(rng.integers(0, classes)) for _ in range(samples)]
    found = accuracy(scores, labels, "prob")
    labelled, right1 = _independent(scores, labels, 1)
    if labelled == 0:
        assert found is None
        return
    assert (found.labelled, found.top1, found.classes) == (labelled, right1, classes)
    assert found.top5 == (_independent(scores, labels, 5)[1] if classes > 5 else None)
    assert predictions(scores).tolist() == [int(top1(row)[0]) for row in scores]  # the one top-1 of qconsist


def test_blocks_add_up_to_the_whole():
    rng = np.random.default_rng(4)
    scores = rng.normal(size=(50, 1, 10)).astype(np.float32)
    labels = labels_array(rng.integers(0, 10, 50).tolist())
    counter = AccuracyCounter("prob")
    for start in range(0, 50, 7):
        counter.add(scores[start:start + 7], labels[start:start + 7])
    whole = accuracy(scores, labels.tolist(), "prob")
    assert counter.result() == whole
    assert whole.figures() == {"accuracy.top1": whole.top1 / 50, "accuracy.top5": whole.top5 / 50}
    assert whole.describe().startswith(f"top-1 {100 * whole.top1 / 50:.2f}%, top-5 ")


def test_labels_beyond_the_outputs_classes_are_not_this_models():
    counter = AccuracyCounter("prob")
    counter.add(np.zeros((3, 1, 2), np.float32), labels_array([0, 1, 999]))
    assert counter.result() is None
    assert counter.problem == ("the labels go up to class 999, but output prob scores 2 classes: they are not this "
                               "model's labels")


@pytest.mark.parametrize("classes", [2, 5])
def test_top5_is_not_counted_with_five_classes_or_fewer(classes):
    found = accuracy(np.eye(classes, dtype=np.float32)[:, None, :], list(range(classes)), "prob")
    assert found.top1 == classes and found.top5 is None and found.figures() == {"accuracy.top1": 1.0}
