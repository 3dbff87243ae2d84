"""Stage determinize on scatters: ScatterElements(reduction="add") as a one-hot MatMul, compared with
onnxruntime's CPU ScatterElements on seeded indices (repeated, negative) and updates; what has no
deterministic form is refused in one line. Tolerance: 1e-6 + 1e-5 * peak (float32, other summation order)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_builders import scatter_model

from qconsist.errors import UnsupportedModelError
from qconsist.stages.determinize import DeterminizeOptions, determinize_model

RTOL, ATOL = 1e-5, 1e-6


def run(model, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})[0]


CASES = [  # data shape, indices shape, axis
    ("1-D histogram", (10,), (200,), 0),
    ("rows, axis 1", (4, 10), (4, 30), 1),
    ("columns, axis 0", (16, 5), (40, 5), 0),
    ("axis -2", (6, 7), (9, 7), -2),
    ("updates cover part of the data", (2, 3, 8), (2, 2, 20), 2),
]


@pytest.mark.parametrize("case_id, data, indices, axis", CASES, ids=[c[0] for c in CASES])
def test_scatter_add_matches_onnxruntime(case_id, data, indices, axis):
    rng = np.random.default_rng(len(case_id))
    size = data[axis]
    feeds = {"data": rng.standard_normal(data).astype(np.float32), "updates": rng.standard_normal(indices).astype(np.float32),
             "indices": rng.integers(-size, size, indices).astype(np.int64)}  # negative ones count from the end
    assert len(np.unique(feeds["indices"])) < feeds["indices"].size  # repeated targets: where atomics race
    model = scatter_model(data, indices, axis)
    rewritten, result = determinize_model(model, inputs={"indices": feeds["indices"]})
    ops = [n.op_type for n in rewritten.graph.node]
    assert "ScatterElements" not in ops and "MatMul" in ops and ops[-1] == "Add"
    onnx.checker.check_model(rewritten, full_check=True)
    (rewrite,) = result.rewritten
    assert rewrite.form == "one-hot MatMul" and rewrite.details["targets"] == size
    assert rewrite.details["one_hot_elements"] == int(np.prod(indices)) * size
    assert rewrite.check.passed and result.passed
    want, got = run(model, feeds), run(rewritten, feeds)
    diff = float(np.abs(got.astype(np.float64) - want).max())
    assert diff <= ATOL + RTOL * float(np.abs(want).max()), f"{case_id}: {diff:.3g}"


def test_partial_updates_are_padded():
    _, result = determinize_model(scatter_model((2, 3, 8), (2, 2, 20), 2),
                                  inputs={"indices": np.zeros((2, 2, 20), np.int64)})
    assert result.rewritten[0].details["padded"] == [0, 1, 0]


def test_constant_indices():
    indices = np.random.default_rng(3).integers(0, 12, 64).astype(np.int64)
    rewritten, result = determinize_model(scatter_model((12,), (64,), constant_indices=indices))
    assert result.passed
    feeds = {"data": np.zeros(12, np.float32), "updates": np.ones(64, np.float32)}
    np.testing.assert_array_equal(run(rewritten, feeds), np.bincount(indices, minlength=12).astype(np.float32))


def test_too_large_a_one_hot_is_refused():
    model = scatter_model((1000,), (5000,))
    with pytest.raises(UnsupportedModelError, match=r"^node 'scatter' \(ScatterElements\) cannot be made deterministic: its "
                                                    r"one-hot form needs 5000000 values \(indices \[5000\] × 1000 targets\), "
                                                    r"above max_one_hot_elements 1000000$"):
        determinize_model(model, DeterminizeOptions(max_one_hot_elements=1_000_000))


@pytest.mark.parametrize(
    "op, reduction, message",
    [
        ("ScatterElements", "mul", r"reduction 'mul' multiplies with CUDA atomics in any order; no deterministic ONNX form$"),
        ("ScatterND", "add", r"reduction 'add' runs on CUDA atomics in any order and qconsist has no deterministic ONNX "
                             r"form for ScatterND$"),
    ],
)
def test_scatters_without_a_deterministic_form_are_refused(op, reduction, message):
    model = scatter_model((10, 4), (6, 1), reduction=reduction, op=op) if op == "ScatterND" else \
        scatter_model((10,), (20,), reduction=reduction)
    with pytest.raises(UnsupportedModelError, match=rf"^node 'scatter' \({op}\) cannot be made deterministic: {message}"):
        determinize_model(model)
    rewritten, result = determinize_model(model, DeterminizeOptions(skip_unsupported=True))
    assert [n.op_type for n in rewritten.graph.node] == [op]
    assert [(n.name, n.op_type) for n in result.refused] == [("scatter", op)]


@pytest.mark.parametrize("reduction", ["none", "min", "max"])
def test_order_independent_scatters_are_left_alone(reduction):
    rewritten, result = determinize_model(scatter_model((10,), (5,), reduction=reduction))
    assert [n.op_type for n in rewritten.graph.node] == ["ScatterElements"]
    assert [(n.name, n.reason.split(":")[0]) for n in result.left_alone] == [("scatter", "reduction none / min / max")]


def test_scatter_add_rewriting_can_be_turned_off():
    _, result = determinize_model(scatter_model((10,), (5,)), DeterminizeOptions(scatter_add=False))
    assert [(n.name, n.reason) for n in result.left_alone] == [("scatter", "scatter_add rewriting is off")]
