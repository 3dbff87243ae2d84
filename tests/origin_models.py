"""Small models built in code for the origin rule (issue 27): each puts one shape of "an input that was not
observed" on purpose — a QDQ Conv whose DequantizeLinear reads a fused kernel's internal tensor, a float Conv
chain ORT runs in NCHWc blocks, a per-channel constant ORT stores in another shape, an ``If`` whose branches read
an outer tensor, a LayerNorm region after an ``If`` whose ranks shape inference cannot follow. Seeded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _save(nodes, inputs, outputs, inits, path: Path, opset: int = 17) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="qconsist-tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def qdq_conv_chain(path: Path, channels: int = 8, size: int = 12, seed: int = 3, convs: int = 2) -> Path:
    """x -> Q/DQ -> (Conv 3x3 int8 -> Q -> DQ) × ``convs`` -> y, scales chosen so that every odd int32
    accumulator is a rounding tie (y_scale = x_scale·w_scale·2): at level all ORT fuses each group into an NHWC
    QLinearConv, whose uint8 outputs between the convs are internal to its graph, and breaks the ties its own
    way; at level disable every Q and DQ runs."""
    rng = np.random.default_rng(seed)
    x_scale, w_scale = 0.1, 0.05
    inits = [numpy_helper.from_array(np.array(x_scale, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(128, np.uint8), "x_zero")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"], name="x_QuantizeLinear"),
             helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"], name="x_DequantizeLinear")]
    source, scale = "x_dq", x_scale
    for i in range(convs):
        y_scale = scale * w_scale * 2
        inits += [
            numpy_helper.from_array(rng.integers(-20, 21, (channels, channels, 3, 3), dtype=np.int8), f"w{i}_q"),
            numpy_helper.from_array(np.array(w_scale, np.float32), f"w{i}_scale"),
            numpy_helper.from_array(np.array(0, np.int8), f"w{i}_zero"),
            numpy_helper.from_array(rng.integers(-200, 200, channels).astype(np.int32), f"b{i}_q"),
            numpy_helper.from_array(np.array(scale * w_scale, np.float32), f"b{i}_scale"),
            numpy_helper.from_array(np.array(0, np.int32), f"b{i}_zero"),
            numpy_helper.from_array(np.array(y_scale, np.float32), f"y{i}_scale"),
            numpy_helper.from_array(np.array(128, np.uint8), f"y{i}_zero"),
        ]
        out = "y" if i == convs - 1 else f"c{i}_dq"
        nodes += [
            helper.make_node("DequantizeLinear", [f"w{i}_q", f"w{i}_scale", f"w{i}_zero"], [f"w{i}"], name=f"w{i}_DequantizeLinear"),
            helper.make_node("DequantizeLinear", [f"b{i}_q", f"b{i}_scale", f"b{i}_zero"], [f"b{i}"], name=f"b{i}_DequantizeLinear"),
            helper.make_node("Conv", [source, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
            helper.make_node("QuantizeLinear", [f"c{i}", f"y{i}_scale", f"y{i}_zero"], [f"c{i}_q"], name=f"c{i}_QuantizeLinear"),
            helper.make_node("DequantizeLinear", [f"c{i}_q", f"y{i}_scale", f"y{i}_zero"], [out], name=f"c{i}_DequantizeLinear"),
        ]
        source, scale = out, y_scale
    return _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, size, size])], inits, path)


def if_layernorm_model(path: Path, width: int = 16, seed: int = 4) -> Path:
    """x [1, 8, width] -> Conv1d 'conv' -> Relu 'relu' (fused with it at level all) -> ``If`` 'gate' (cond: the sum
    of x > 0) whose branches read the outer tensor ``act`` (then: Relu, else: Neg) -> a LayerNorm written out (ReduceMean,
    Sub, Mul, ReduceMean, Add, Sqrt, Div, Mul, Add) -> + ``act`` 'residual' -> y. Quantized (QDQ), ORT's quantizer
    removes the Relu and gives the Conv's output the Relu's name: the branches then read the unrectified tensor."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 8, 3)) / 5).astype(np.float32), "conv_w"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, width).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.normal(0, 0.1, width).astype(np.float32), "beta")]
    branch = lambda name, op: helper.make_graph(  # noqa: E731 - two one-node branches
        [helper.make_node(op, ["act"], [f"{name}_out"], name=f"{name}_{op.lower()}")], name, [],
        [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [1, 8, width])])
    nodes = [
        helper.make_node("Conv", ["x", "conv_w"], ["conv"], name="conv", pads=[1, 1]),
        helper.make_node("Relu", ["conv"], ["act"], name="relu"),
        helper.make_node("ReduceSum", ["x"], ["total"], name="total", keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"], name="positive"),
        helper.make_node("If", ["cond"], ["gated"], name="gate", then_branch=branch("then", "Relu"), else_branch=branch("else", "Neg")),
        helper.make_node("ReduceMean", ["gated"], ["mean"], name="ln_mean", axes=[-1]),
        helper.make_node("Sub", ["gated", "mean"], ["centred"], name="ln_sub"),
        helper.make_node("Mul", ["centred", "centred"], ["squared"], name="ln_square"),
        helper.make_node("ReduceMean", ["squared"], ["var"], name="ln_var", axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], name="ln_eps"),
        helper.make_node("Sqrt", ["var_eps"], ["std"], name="ln_sqrt"),
        helper.make_node("Div", ["centred", "std"], ["normed"], name="ln_div"),
        helper.make_node("Mul", ["normed", "gamma"], ["scaled"], name="ln_gamma"),
        helper.make_node("Add", ["scaled", "beta"], ["ln"], name="ln_beta"),
        helper.make_node("Add", ["ln", "act"], ["y"], name="residual"),
    ]
    return _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, width])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, width])], inits, path)


def float_conv_chain(path: Path, channels: int = 32, convs: int = 3, size: int = 16, seed: int = 0) -> Path:
    """x [1, 3, size, size] -> (Conv 3x3 'conv<i>' -> Relu 'relu<i>') × ``convs`` -> Identity 'out' -> y, float. At
    level all ORT runs the convs in NCHWc blocks (fused with their Relu): none of their outputs has a layout the
    graph establishes, so only y is observed in both runs."""
    rng = np.random.default_rng(seed)
    nodes, inits, source, cin = [], [], "x", 3
    for i in range(convs):
        inits += [numpy_helper.from_array((rng.standard_normal((channels, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.normal(0, 0.1, channels).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [source, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        source, cin = f"r{i}", channels
    nodes.append(helper.make_node("Identity", [source], ["y"], name="out"))
    return _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, size, size])], inits, path)


def per_channel_affine_model(path: Path, channels: int = 32, size: int = 10, seed: int = 0) -> Path:
    """Conv 'conv' -> Relu -> Mul by a (1, C, 1, 1) constant 'mul' -> Add a (1, C, 1, 1) constant 'add' -> Conv 1x1
    'conv2' -> y, float, to be quantized (QDQ): at level all ORT's NHWC transformer stores the DequantizeLinear
    outputs of the two constants as (1, 1, 1, C), the same values in the same order."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((channels, 3, 3, 3)) / 5).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.1, channels).astype(np.float32), "b"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, (1, channels, 1, 1)).astype(np.float32), "scale"),
             numpy_helper.from_array(rng.normal(0, 0.1, (1, channels, 1, 1)).astype(np.float32), "shift"),
             numpy_helper.from_array((rng.standard_normal((channels, channels, 1, 1)) / 5).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "scale"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "shift"], ["a"], name="add"),
             helper.make_node("Conv", ["a", "w2"], ["y"], name="conv2")]
    return _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, size, size])], inits, path)
