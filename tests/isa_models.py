"""A QDQ model built in code whose u8·s8 products saturate on AVX2 without VNNI (tests of the instruction set).

``saturating_qdq_model``: QuantizeLinear (int8) → DequantizeLinear → Conv 1×1 whose int8 weights are ±127 →
QuantizeLinear → DequantizeLinear. onnxruntime fuses it into a QLinearConv whose activations it shifts to u8
(QDQS8ToU8Transformer): an input near the top of its range becomes 255, and two neighbouring input channels
give 255·127 + 255·127 = 64,770, which VPMADDUBSW (AVX2 without VNNI) clamps to 32,767 while VPDPBUSD (VNNI)
and the SSE2 kernel sum exactly. The input channels alternate between large and mixed values so that some
pairs saturate and others do not.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CHANNELS_IN, CHANNELS_OUT, SIZE = 16, 8, 6


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    """``graph`` as a checked opset-17, IR 8 model at ``path``."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def saturating_qdq_model(path: Path) -> Path:
    rng = np.random.default_rng(28)
    weights = np.where(rng.random((CHANNELS_OUT, CHANNELS_IN, 1, 1)) < 0.75, 127, -127).astype(np.int8)
    weights[0] = 127  # every pair of the first output channel saturates at a full input
    initializers = [
        numpy_helper.from_array(np.array(1.0 / 127, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "x_zero"),
        numpy_helper.from_array(weights, "w_q"),
        numpy_helper.from_array(np.full(CHANNELS_OUT, 1.0 / 127, np.float32), "w_scale"),
        numpy_helper.from_array(np.zeros(CHANNELS_OUT, np.int8), "w_zero"),
        numpy_helper.from_array(np.array(0.25, np.float32), "y_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "y_zero"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"], name="quantize_input"),
        helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"], name="dequantize_input"),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w_dq"], name="dequantize_weight", axis=0),
        helper.make_node("Conv", ["x_dq", "w_dq"], ["conv"], name="conv"),
        helper.make_node("QuantizeLinear", ["conv", "y_scale", "y_zero"], ["y_q"], name="quantize_output"),
        helper.make_node("DequantizeLinear", ["y_q", "y_scale", "y_zero"], ["y"], name="dequantize_output"),
    ]
    graph = helper.make_graph(
        nodes, "saturating_qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CHANNELS_IN, SIZE, SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, CHANNELS_OUT, SIZE, SIZE])],
        initializers,
    )
    return _save(graph, path)


def saturating_inputs(path: Path, count: int = 2) -> Path:
    """``count`` samples in [0, 1]: most channels near 1 (u8 255 after the shift), every fourth mixed."""
    rng = np.random.default_rng(29)
    samples = rng.uniform(0.9, 1.0, (count, CHANNELS_IN, SIZE, SIZE)).astype(np.float32)
    samples[:, 3::4] = rng.uniform(-1.0, 1.0, (count, CHANNELS_IN // 4, SIZE, SIZE))
    np.save(path, samples)
    return path


def saturating_float_model(path: Path) -> Path:
    """The float model ``quantize_static`` (per-channel int8 weights, int8 activations) turns into
    ``saturating_qdq_model``'s kind: a Conv 1×1 whose weights are ±1 (int8 ±127) on inputs near 1 (int8 127)."""
    rng = np.random.default_rng(28)
    weights = np.where(rng.random((CHANNELS_OUT, CHANNELS_IN, 1, 1)) < 0.75, 1.0, -1.0).astype(np.float32)
    weights[0] = 1.0
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "saturating_float",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CHANNELS_IN, SIZE, SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, CHANNELS_OUT, SIZE, SIZE])],
        [numpy_helper.from_array(weights, "w")],
    )
    return _save(graph, path)


def shared_constant_qdq_model(path: Path) -> Path:
    """A QDQ model in which one int8 constant (values outside [-64, 64]) feeds two nodes through one
    DequantizeLinear: ``x + c + c``. onnxruntime gives each consumer its own copy of the DequantizeLinear, and with
    ``session.x64quantprecision=1`` converts each copy's weight to u8 under the same name (``<name>_s8_2_u8``): the
    second conversion fails the session ("AddInitializedOrtValue Attempt to replace the existing tensor"), as it
    does for ppocr_cls quantized (one constant shared by its 18 hard-swish Adds)."""
    initializers = [
        numpy_helper.from_array(np.array([[100, -100, 3, 7]], np.int8), "c_q"),
        numpy_helper.from_array(np.array(0.05, np.float32), "c_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "c_zero"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["c_q", "c_scale", "c_zero"], ["c"], name="dequantize_constant"),
        helper.make_node("Add", ["x", "c"], ["a"], name="add_first"),
        helper.make_node("Add", ["a", "c"], ["y"], name="add_second"),
    ]
    graph = helper.make_graph(nodes, "shared_constant",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], initializers)
    return _save(graph, path)


def shared_constant_float_model(path: Path) -> Path:
    """``saturating_float_model``'s Conv followed by Relu, ``+ c``, Relu, ``+ c``: one constant ``c`` (±4, so
    int8 ±127) for both Adds (the Relus keep onnxruntime from folding them into the Conv's bias): ``quantize_static`` gives ``c`` one int8 initializer and one DequantizeLinear feeding both, which
    ``session.x64quantprecision=1`` cannot load (``shared_constant_qdq_model``)."""
    rng = np.random.default_rng(28)
    weights = np.where(rng.random((CHANNELS_OUT, CHANNELS_IN, 1, 1)) < 0.75, 1.0, -1.0).astype(np.float32)
    weights[0] = 1.0
    constant = np.where(np.arange(CHANNELS_OUT) % 2 == 0, 4.0, -4.0).astype(np.float32).reshape(1, CHANNELS_OUT, 1, 1)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["conv"], name="conv"),
         helper.make_node("Relu", ["conv"], ["relu"], name="relu_first"),
         helper.make_node("Add", ["relu", "c"], ["added"], name="add_first"),
         helper.make_node("Relu", ["added"], ["relu_added"], name="relu_second"),
         helper.make_node("Add", ["relu_added", "c"], ["y"], name="add_second")], "shared_constant_float",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CHANNELS_IN, SIZE, SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, CHANNELS_OUT, SIZE, SIZE])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(constant, "c")],
    )
    return _save(graph, path)


def saturating_qlinear_model(path: Path) -> Path:
    """``saturating_qdq_model``'s Conv written as the integer op itself: QuantizeLinear (u8, zero point 128) →
    QLinearConv (s8 weights ±127) → DequantizeLinear. The integer kernel runs at every optimization level, so a
    dump at level ``disable`` observes its input and output by the original names and the origin is ``conv``,
    a node of the original model that ``diff --replay`` can cut out and run alone; on AVX2 without VNNI its
    u8·s8 sums saturate (inputs near 1 are u8 255)."""
    rng = np.random.default_rng(28)
    weights = np.where(rng.random((CHANNELS_OUT, CHANNELS_IN, 1, 1)) < 0.75, 127, -127).astype(np.int8)
    weights[0] = 127
    initializers = [
        numpy_helper.from_array(np.array(1.0 / 127, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(128, np.uint8), "x_zero"),
        numpy_helper.from_array(weights, "w_q"),
        numpy_helper.from_array(np.full(CHANNELS_OUT, 1.0 / 127, np.float32), "w_scale"),
        numpy_helper.from_array(np.zeros(CHANNELS_OUT, np.int8), "w_zero"),
        numpy_helper.from_array(np.array(0.25, np.float32), "y_scale"),
        numpy_helper.from_array(np.array(128, np.uint8), "y_zero"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"], name="quantize_input"),
        helper.make_node("QLinearConv", ["x_q", "x_scale", "x_zero", "w_q", "w_scale", "w_zero", "y_scale", "y_zero"],
                         ["y_q"], name="conv"),
        helper.make_node("DequantizeLinear", ["y_q", "y_scale", "y_zero"], ["y"], name="dequantize_output"),
    ]
    graph = helper.make_graph(
        nodes, "saturating_qlinear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CHANNELS_IN, SIZE, SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, CHANNELS_OUT, SIZE, SIZE])],
        initializers,
    )
    return _save(graph, path)


def blocked_conv_model(path: Path) -> Path:
    """A float Relu → Conv 3×3 (16 → 32 channels, random weights) → BatchNormalization on 12×12: at level all
    onnxruntime folds the BatchNormalization and runs the Conv in NCHWc channel blocks (NchwcTransformer: 16 on
    AVX-512, 8 on AVX2 and SSE), whose sums the float kernels (AVX-512F, FMA3, SSE) round differently."""
    rng = np.random.default_rng(11)
    values = {"w": rng.normal(0, 0.3, (32, 16, 3, 3)), "b": rng.normal(0, 0.1, 32), "scale": rng.uniform(0.5, 2, 32),
              "shift": rng.normal(0, 0.1, 32), "mean": rng.normal(0, 0.1, 32), "var": rng.uniform(0.5, 2, 32)}
    nodes = [helper.make_node("Relu", ["input"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["y"], name="bn")]
    graph = helper.make_graph(nodes, "blocked_conv", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 16, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32, 12, 12])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in values.items()])
    return _save(graph, path)
