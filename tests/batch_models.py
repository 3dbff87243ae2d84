"""Small models built in code whose batch is not simply the first axis of every tensor (issue 27 items 3, 4,
10): shape tensors that carry N, a Transpose that moves the batch, a Flatten that merges it, a recurrent state
``[2, B, 128]``, a rank-0 int64 input, a batch fixed at 10."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _save(graph: onnx.GraphProto, path: Path, opset: int = 17) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def shape_transpose_flatten_model(path: Path, batch: int | str = "N") -> Path:
    """x[N,3,8,8] -> Conv -> Relu -> Transpose(N<->C) -> Relu -> Transpose back -> Flatten(axis=0) [1, N*256]
    -> Reshape to [N, -1] (N read by Shape -> Gather) -> Gemm -> y[N,5]; the PyTorch export's flatten."""
    rng = np.random.default_rng(27)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "b"),
        numpy_helper.from_array(rng.normal(0, 0.1, (5, 256)).astype(np.float32), "fc_w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (5,)).astype(np.float32), "fc_b"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "axes0"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("Transpose", ["relu"], ["moved"], name="move_batch", perm=[1, 0, 2, 3]),
        helper.make_node("Relu", ["moved"], ["moved_relu"], name="relu_moved"),
        helper.make_node("Transpose", ["moved_relu"], ["back"], name="move_back", perm=[1, 0, 2, 3]),
        helper.make_node("Flatten", ["back"], ["flat"], name="flatten_all", axis=0),
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["n"], name="batch_size", axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"], name="n_as_list"),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], name="target_shape", axis=0),
        helper.make_node("Reshape", ["flat", "target"], ["rows"], name="reshape"),
        helper.make_node("Gemm", ["rows", "fc_w", "fc_b"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(nodes, "shape_transpose_flatten",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5])], inits)
    return _save(graph, path)


def state_model(path: Path, state_input: bool = False) -> Path:
    """x[B,16] -> MatMul -> h[B,128]; the state ``[2, B, 128]`` = Concat(h, 2h) on a new axis 0 (plus half the
    state fed in, with ``state_input``); y[B,128]."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.normal(0, 0.2, (16, 128)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([0], np.int64), "axes0"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
        helper.make_node("Tanh", ["h"], ["y"], name="tanh"),
        helper.make_node("Unsqueeze", ["y", "axes0"], ["u"], name="unsqueeze"),
        helper.make_node("Mul", ["u", "two"], ["u2"], name="double"),
        helper.make_node("Concat", ["u", "u2"], ["state_new" if state_input else "state"], name="concat", axis=0),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 16])]
    if state_input:
        nodes += [helper.make_node("Mul", ["state_in", "half"], ["state_half"], name="halve"),
                  helper.make_node("Add", ["state_new", "state_half"], ["state"], name="carry")]
        inputs.append(helper.make_tensor_value_info("state_in", TensorProto.FLOAT, [2, "B", 128]))
    graph = helper.make_graph(nodes, "state", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 128]),
                               helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "B", 128])], inits)
    return _save(graph, path)


def sample_rate_model(path: Path) -> Path:
    """x[1,16] float and ``sr`` a rank-0 int64 sample rate: y = x * float(sr) / 16000."""
    nodes = [helper.make_node("Cast", ["sr"], ["srf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Div", ["srf", "base"], ["ratio"], name="ratio"),
             helper.make_node("Mul", ["x", "ratio"], ["y"], name="scale")]
    graph = helper.make_graph(nodes, "sample_rate",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
                               helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
                              [numpy_helper.from_array(np.array(16000.0, np.float32), "base")])
    return _save(graph, path)


def fixed_batch_model(path: Path, batch: int = 10) -> Path:
    """x[10,3,8,8] -> Conv -> Relu -> GlobalAveragePool -> Flatten -> y[10,4]: computes per sample, batch fixed."""
    rng = np.random.default_rng(10)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
             helper.make_node("GlobalAveragePool", ["relu"], ["pool"], name="pool"),
             helper.make_node("Flatten", ["pool"], ["y"], name="flatten")]
    graph = helper.make_graph(nodes, "fixed_batch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])], inits)
    return _save(graph, path)


def save_feeds(folder: Path, samples: list[dict[str, np.ndarray]]) -> Path:
    """A folder of ``.npz`` files, one sample each, fed exactly as they are."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, sample in enumerate(samples):
        np.savez(folder / f"{i:03d}.npz", **sample)
    return folder


def baked_batch_model(path: Path) -> Path:
    """Relu then a Reshape to ``[1, 192]``: the batch of one is baked into the graph (a constant shape), so the
    model cannot be re-stamped for another batch size."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"])]
    graph = helper.make_graph(
        nodes, "baked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 192])],
        [numpy_helper.from_array(np.array([1, 192], np.int64), "shape")],
    )
    return _save(graph, path)
