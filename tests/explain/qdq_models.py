"""A small QDQ model built in code whose QDQ -> QLinearConv fusion rounds differently from the unfused graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def qdq_conv_model(path: Path, seed: int = 3, channels: int = 8, size: int = 12) -> Path:
    """x (float) -> Q/DQ -> Conv 3x3 (int8 weights, int32 bias, per-tensor) -> Q/DQ -> y.

    Unfused (level disable), the convolution runs in float on dequantized values and QuantizeLinear rounds
    its result; fused (QDQSelectorActionTransformer: QLinearConv), onnxruntime accumulates in int32 and
    requantizes with its own fixed-point scale, so values near a rounding tie land one step apart."""
    rng = np.random.default_rng(seed)
    # y_scale = x_scale·w_scale·2 in exact arithmetic: every odd int32 accumulator is a rounding tie, which the
    # float graph and the fused kernel break with their own float errors
    x_scale, w_scale, y_scale = 0.1, 0.05, 0.01
    weight = rng.integers(-127, 128, (channels, channels, 3, 3), dtype=np.int8)
    bias = rng.integers(-2000, 2000, channels).astype(np.int32)
    inits = [
        numpy_helper.from_array(np.array(x_scale, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(0, np.uint8), "x_zero"),
        numpy_helper.from_array(weight, "w_q"),
        numpy_helper.from_array(np.array(w_scale, np.float32), "w_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "w_zero"),
        numpy_helper.from_array(bias, "b_q"),
        numpy_helper.from_array(np.array(x_scale * w_scale, np.float32), "b_scale"),
        numpy_helper.from_array(np.array(0, np.int32), "b_zero"),
        numpy_helper.from_array(np.array(y_scale, np.float32), "y_scale"),
        numpy_helper.from_array(np.array(128, np.uint8), "y_zero"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"], name="x_QuantizeLinear"),
        helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"], name="x_DequantizeLinear"),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], name="w_DequantizeLinear"),
        helper.make_node("DequantizeLinear", ["b_q", "b_scale", "b_zero"], ["b"], name="b_DequantizeLinear"),
        helper.make_node("Conv", ["x_dq", "w", "b"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["conv", "y_scale", "y_zero"], ["conv_q"], name="conv_QuantizeLinear"),
        helper.make_node("DequantizeLinear", ["conv_q", "y_scale", "y_zero"], ["y"], name="conv_DequantizeLinear"),
    ]
    graph = helper.make_graph(
        nodes, "qdq_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, size, size])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def qdq_inputs(path: Path, count: int = 3, seed: int = 5, channels: int = 8, size: int = 12) -> Path:
    """Seeded inputs in the quantizer's range [0, 25.5]."""
    rng = np.random.default_rng(seed)
    np.save(path, rng.uniform(0.0, 25.5, (count, channels, size, size)).astype(np.float32))
    return path
