"""A map's class axis comes from the graph (the axis its Softmax normalizes, with nothing but an Identity after
it), never from a coincidence of shapes; with it, one top-1 per position."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from qconsist.compare.accuracy import predictions, top1
from qconsist.compare.kinds import OutputKind, judged_outputs


def _softmax_model(after: list[onnx.NodeProto], shape_out: list[int]) -> onnx.ModelProto:
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=2), *after]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 6])],
                              [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, shape_out)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_the_class_axis_is_the_softmax_axis_and_none_after_a_transpose():
    plain = judged_outputs(_softmax_model([helper.make_node("Identity", ["s"], ["y"])], [1, 6, 6]))
    assert [(j.kind, j.class_axis) for j in plain] == [(OutputKind.MAP, 2)]
    # six positions of six classes: after a Transpose the classes lie on axis 1, a shape cannot tell which
    moved = judged_outputs(_softmax_model([helper.make_node("Transpose", ["s"], ["y"], perm=[0, 2, 1])], [1, 6, 6]))
    assert [(j.kind, j.class_axis) for j in moved] == [(OutputKind.MAP, None)]


def test_one_top1_per_sample_or_per_position():
    values = np.array([[[0.1, 0.9], [np.nan, 0.2]], [[0.5, 0.5], [0.3, 0.1]]], dtype=np.float32)
    assert top1(values).tolist() == [1, 0]  # per sample, flattened: a NaN is never the class, ties go first
    assert top1(values, 2).tolist() == [[1, 1], [0, 0]]
    assert predictions(values).tolist() == top1(values).tolist()
