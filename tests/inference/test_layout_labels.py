"""The axis labels behind every layout (``qconsist/inference/layout.py``), on graphs written by hand: the
permutation comes from the graph's ops and attributes, never from shapes."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qconsist.inference.layout import Layouts, Whole, permutation, to_original


def _model(nodes, inputs, outputs, inits=(), domains=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *[helper.make_opsetid(d, 1) for d in domains]])


def test_permutation_is_read_from_labels():
    labels = tuple(("x", i) for i in range(4))
    nhwc = tuple(labels[i] for i in (0, 2, 3, 1))
    assert permutation(nhwc, labels) == (0, 2, 3, 1)
    assert permutation(labels, Whole("x")) == ()
    assert permutation(Whole("x"), Whole("y")) == ()  # two graphs name one value differently
    assert permutation(tuple(("y", i) for i in (0, 2, 3, 1)), Whole("x")) == (0, 2, 3, 1)
    assert permutation((("a", 0), ("b", 0)), (("x", 0), ("x", 1))) is None  # two values are not one
    assert permutation(None, labels) is None
    assert permutation(nhwc[:3], labels) is None
    x = np.arange(2 * 3 * 3 * 3).reshape(2, 3, 3, 3)  # C == H == W
    assert np.array_equal(to_original(np.transpose(x, (0, 2, 3, 1)), (0, 2, 3, 1)), x)


def test_keras_input_transposes_that_cancel_leave_the_conv_channels_last():
    """keras2onnx's graph: NHWC input → Transpose(0,3,1,2) → Conv → Transpose(0,2,3,1). ORT's NHWC conv reads the
    input directly: its output is the Conv's output channels last, and the original's final Transpose output in
    its own order."""
    w = numpy_helper.from_array(np.ones((3, 3, 1, 1), np.float32), "w")
    original = _model([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
                       helper.make_node("Conv", ["t", "w"], ["c"], name="conv"),
                       helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])],
                      [("x", [1, 3, 3, 3])], ["y"], [w])
    optimized = _model([helper.make_node("NhwcConv", ["x", "w"], ["c"], domain="com.microsoft"),
                        helper.make_node("Identity", ["c"], ["y"])], [("x", [1, 3, 3, 3])], ["y"], [w], ["com.microsoft"])
    layouts = Layouts.of(original, optimized)
    assert layouts.permutation("c", "c") == (0, 2, 3, 1)
    assert layouts.permutation("y", "y") == ()


def test_nchwc_blocks_are_no_permutation():
    """A tensor computed by a com.microsoft.nchwc op holds channel blocks: its layout cannot be established, even
    where its name and shape are the original's; ReorderOutput gives the original order back."""
    w = numpy_helper.from_array(np.ones((8, 8, 1, 1), np.float32), "w")
    original = _model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
                      [("x", [1, 8, 8, 8])], ["y"], [w])
    optimized = _model([helper.make_node("ReorderInput", ["x"], ["r"], domain="com.microsoft.nchwc"),
                        helper.make_node("Conv", ["r", "w"], ["c"], domain="com.microsoft.nchwc"),
                        helper.make_node("ReorderOutput", ["c"], ["o"], domain="com.microsoft.nchwc", channels=8),
                        helper.make_node("Relu", ["o"], ["y"])],
                       [("x", [1, 8, 8, 8])], ["y"], [w], ["com.microsoft.nchwc"])
    layouts = Layouts.of(original, optimized)
    assert layouts.permutation("c", "c") is None and layouts.blocked("c")
    assert layouts.permutation("y", "y") == ()


def test_cuda_internal_nhwc_ops_keep_their_input_positions():
    """The CUDA EP with ``prefer_nhwc`` (seen on an H100, onnxruntime-gpu 1.31.1): Transpose to NHWC, then
    ``com.ms.internal.nhwc`` Conv and MaxPool channels last, an ONNX PRelu between them on the NHWC tensor, and a
    Transpose back. Every tensor between the Transposes is its original channels last; with C == H == W the
    shapes say nothing."""
    w1 = numpy_helper.from_array(np.ones((10, 3, 3, 3), np.float32), "w1")
    w2 = numpy_helper.from_array(np.ones((10, 10, 1, 1), np.float32), "w2")
    slope = numpy_helper.from_array(np.full((10, 1, 1), 0.1, np.float32), "slope")
    slope_nhwc = numpy_helper.from_array(np.full((1, 1, 10), 0.1, np.float32), "slope_nhwc")
    original = _model([helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1"),
                       helper.make_node("PRelu", ["c1", "slope"], ["p1"], name="prelu1"),
                       helper.make_node("MaxPool", ["p1"], ["m1"], name="pool1", kernel_shape=[1, 1]),
                       helper.make_node("Conv", ["m1", "w2"], ["y"], name="conv2")],
                      [("x", [1, 3, 12, 12])], ["y"], [w1, w2, slope])
    nhwc = "com.ms.internal.nhwc"
    optimized = _model([helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 3, 1]),
                        helper.make_node("Conv", ["xt", "w1"], ["c1"], domain=nhwc),
                        helper.make_node("PRelu", ["c1", "slope_nhwc"], ["p1"]),
                        helper.make_node("MaxPool", ["p1"], ["m1"], domain=nhwc, kernel_shape=[1, 1]),
                        helper.make_node("Conv", ["m1", "w2"], ["yt"], domain=nhwc),
                        helper.make_node("Transpose", ["yt"], ["y"], perm=[0, 3, 1, 2])],
                       [("x", [1, 3, 12, 12])], ["y"], [w1, w2, slope_nhwc], [nhwc])
    layouts = Layouts.of(original, optimized)
    for name in ("c1", "p1", "m1"):
        assert layouts.permutation(name, name) == (0, 2, 3, 1), name
    assert layouts.permutation("yt", "y") == (0, 2, 3, 1)
    assert layouts.permutation("y", "y") == ()
