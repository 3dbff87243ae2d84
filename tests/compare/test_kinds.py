"""Each output's kind comes from the graph or a declaration, never from its shape or from being first; an
output made by a Concat is judged part by part; top-1 only for class scores."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from output_models import constant, model
from qconsist.compare import OutputKind, class_scores_output, compare_outputs, judged_outputs
from qconsist.compare.kinds import JudgedOutput
from qconsist.errors import ConfigError

CLASS, MAP = OutputKind.CLASS_SCORES, OutputKind.MAP


def _kinds(built, declared=None):
    return [(j.label, j.kind, j.why) for j in judged_outputs(built, declared)]


def _softmax_model(shape, axis=None, op="Softmax", after=(), opset=17, out_shape=None):
    attrs = {} if axis is None else {"axis": axis}
    nodes = [helper.make_node(op, ["x"], ["s" if after else "y"], name="softmax", **attrs), *after]
    return model(nodes, [("x", shape)], [("y", out_shape or shape)], opset=opset)


@pytest.mark.parametrize("shape, axis, opset, op, kind, why", [
    ([1, 5], 1, 17, "Softmax", CLASS, "inferred: Softmax 'softmax' over axis 1, one distribution over 5 classes per sample"),
    (["N", 5], None, 17, "Softmax", CLASS, "inferred: Softmax 'softmax' over axis 1, one distribution over 5 classes per sample"),
    ([1, 5], -1, 17, "LogSoftmax", CLASS, "inferred: LogSoftmax 'softmax' over axis 1, one distribution over 5 classes per sample"),
    ([5], 0, 17, "Softmax", CLASS, "inferred: Softmax 'softmax' over axis 0, one distribution over 5 classes per sample"),
    ([1, 5, 1, 1], 1, 17, "Softmax", CLASS, "inferred: Softmax 'softmax' over axis 1, one distribution over 5 classes per sample"),
    # C == H == W: a class axis at each of 16 positions, whatever the coincidence of sizes
    ([1, 4, 4, 4], 1, 17, "Softmax", MAP, "inferred: Softmax 'softmax' over axis 1, one distribution over 4 classes at each of 16 positions"),
    # below opset 13 Softmax normalizes every axis from `axis` on: one distribution per sample over 4*4*4
    ([1, 4, 4, 4], 1, 11, "Softmax", CLASS, "inferred: Softmax 'softmax' over axis 1, one distribution over 64 classes per sample"),
    ([1, 3, 4, 5], 2, 11, "Softmax", MAP, "inferred: Softmax 'softmax' over axis 2, one distribution over 20 classes at each of 3 positions"),
    ([2, 5], 0, 17, "Softmax", None, "not inferred: Softmax 'softmax' over axis 0, the batch axis"),
    ([1, 1], 1, 17, "Softmax", None, "not inferred: Softmax 'softmax' over axis 1 normalizes a single value (always 1)"),
    (["N", "C"], 1, 17, "Softmax", None, "not inferred: Softmax 'softmax' over axis 1, but its shape ['N', 'C'] is not known"),
])
def test_softmax_kinds(shape, axis, opset, op, kind, why):
    assert _kinds(_softmax_model(shape, axis, op, opset=opset)) == [("y", kind, why)]


def test_not_inferred_from_shapes_or_order():
    """A [1, 5] output made by Gemm (a classifier's logits, or five box coordinates: the graph cannot tell) and a
    Sigmoid's independent probabilities are not class scores, whatever their shape or position."""
    nodes = [helper.make_node("Gemm", ["x", "w"], ["logits"], name="fc", transB=1),
             helper.make_node("Sigmoid", ["logits"], ["p"], name="sigmoid")]
    built = model(nodes, [("x", [1, 3])], [("logits", [1, 5]), ("p", [1, 5])], [constant("w", np.ones((5, 3), np.float32))])
    assert _kinds(built) == [
        ("logits", None, "not inferred: produced by Gemm 'fc'"),
        ("p", None, "not inferred: produced by Sigmoid 'sigmoid' (independent probabilities: an arg-max among them is no class decision)"),
    ]


def test_rearranging_after_the_softmax():
    flatten = helper.make_node("Flatten", ["s"], ["y"], name="flatten", axis=1)
    kept = _softmax_model(["N", 5, 1, 1], 1, after=[flatten], out_shape=["N", 5])
    assert _kinds(kept)[0][1] is CLASS
    merged = _softmax_model(["N", 5], 1, after=[helper.make_node("Reshape", ["s", "minus_one"], ["y"], name="flat")],
                            out_shape=[None])
    merged.graph.initializer.append(constant("minus_one", np.array([-1], np.int64)))
    assert _kinds(merged) == [("y", None, "not inferred: Softmax 'softmax' over axis 1, then reshaped so that its samples are not told apart")]


def test_concat_output_is_judged_part_by_part():
    """A detector's head: boxes (Mul) and class scores (Sigmoid) in one tensor, as NudeNet's output0."""
    nodes = [helper.make_node("Mul", ["boxes_in", "stride"], ["boxes"], name="decode"),
             helper.make_node("Sigmoid", ["logits"], ["scores"], name="sigmoid"),
             helper.make_node("Concat", ["boxes", "scores"], ["output0"], name="concat", axis=1)]
    built = model(nodes, [("boxes_in", [1, 4, 6]), ("logits", [1, 3, 6])], [("output0", [1, 7, 6])], [constant("stride", np.float32(8))])
    judged = judged_outputs(built)
    assert [(j.label, j.axis, j.start, j.stop, j.source) for j in judged] == [
        ("output0", None, 0, 0, ""), ("output0[:, 0:4]", 1, 0, 4, "boxes"), ("output0[:, 4:7]", 1, 4, 7, "scores")]
    assert judged[2].why.endswith("; a part of Concat 'concat'")
    values = np.arange(42, dtype=np.float32).reshape(1, 7, 6)
    assert np.array_equal(judged[2].select(values), values[:, 4:7])


def test_declared_kinds_win_and_are_checked():
    built = _softmax_model([1, 4, 4, 4], 1)
    assert _kinds(built, {"y": OutputKind.REGRESSION}) == [("y", OutputKind.REGRESSION, "declared in [evaluation] outputs")]
    with pytest.raises(ConfigError, match=r"^\[evaluation\] outputs names 'prob', which the model does not output \(its outputs: y\)$"):
        judged_outputs(built, {"prob": CLASS})


def test_labels_need_one_class_scores_output():
    two = model([helper.make_node("Softmax", ["x"], ["a"], name="s1", axis=1), helper.make_node("Softmax", ["x"], ["b"], name="s2", axis=1)],
                [("x", [1, 5])], [("a", [1, 5]), ("b", [1, 5])])
    with pytest.raises(ConfigError, match=r"^labels need one class-scores output, and the model has 2 \(a, b\); declare the one"):
        class_scores_output(judged_outputs(two))
    assert class_scores_output(judged_outputs(two, {"b": OutputKind.REGRESSION})).output == "a"
    none = model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [("x", [1, 5])], [("y", [1, 5])])
    with pytest.raises(ConfigError, match=r"^labels need the model's class-scores output, and none is declared or inferred "
                                          r"\(y: undeclared \(not inferred: produced by Relu 'relu'\)\); declare it: "
                                          r'\[evaluation\] outputs = \{y = "class-scores"\}$'):
        class_scores_output(judged_outputs(none))


def test_top1_only_for_class_scores_and_sqnr_for_every_output_and_part():
    rng = np.random.default_rng(0)
    scores = rng.random((4, 5)).astype(np.float32)
    boxes = rng.normal(0, 100, (4, 3)).astype(np.float32)
    reference = [{"prob": scores, "out": np.concatenate([boxes, scores[:, :2]], axis=1)}]
    noisy_scores = scores + rng.normal(0, 0.05, scores.shape).astype(np.float32)
    candidate = [{"prob": noisy_scores, "out": np.concatenate([boxes + 1, np.zeros((4, 2), np.float32)], axis=1)}]
    judged = [JudgedOutput("prob", CLASS, "declared"), JudgedOutput("out", None, "x"),
              JudgedOutput("out", None, "x", 1, 3, 5, "zeroed")]
    result = compare_outputs(reference, candidate, None, None, judged)
    prob, whole, part = result.judgements
    assert prob.top1_agreement == float(np.mean(scores.argmax(1) == noisy_scores.argmax(1)))
    assert whole.top1_agreement is None and part.top1_agreement is None
    assert result.top1_agreement == prob.top1_agreement
    # independent SQNR: 20·log10(‖x‖/‖x − y‖) in float64
    x, y = scores.astype(np.float64), noisy_scores.astype(np.float64)
    assert prob.sqnr_db == pytest.approx(20 * np.log10(np.linalg.norm(x) / np.linalg.norm(x - y)), abs=1e-4)
    assert part.sqnr_db == pytest.approx(0.0, abs=1e-9) and part.noise.cosine == 0.0  # the part is gone
    assert whole.sqnr_db > 35  # the whole output, dominated by the boxes, looks healthy
    assert [j.label for j in result.below(15.0)] == ["out[:, 3:5]"]
    assert result.below(None) == []
    no_class = compare_outputs(reference, candidate, None, None, judged[1:])
    assert no_class.top1_agreement is None


def test_integer_outputs_are_judged_by_identity_not_sqnr():
    """An ArgMax's class indices: an SQNR of labels means nothing; the samples given identically do."""
    reference = [{"label": np.array([c], np.int64)} for c in (3, 1, 4, 1)]  # four samples of one label each
    candidate = [{"label": np.array([c], np.int64)} for c in (3, 2, 4, 1)]
    result = compare_outputs(reference, candidate, None, None, [JudgedOutput("label", None, "not inferred")])
    (label,) = result.judgements
    assert label.integer and label.identical == 3 and label.samples == 4
    assert label.describe() == "label (undeclared, integers): 3/4 samples identical"
    assert label.to_json()["sqnr_db"] is None and result.below(15.0) == []
