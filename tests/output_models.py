"""Small ONNX models built in code for the output-kind tests: what each graph output is, and a map model whose
int8 quantization destroys its output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    """A model of ``nodes``; ``inputs``/``outputs`` as (name, shape) with float elements."""
    graph = helper.make_graph(
        nodes, "kinds", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def constant(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values), name)


def build_outlier_map_model(path: Path) -> Path:
    """A segmentation-like map head whose per-tensor int8 quantization destroys its output: x (1×3×16×16) →
    conv1 3×3 → Relu → conv2 1×1 to 9 channels, the ninth with a bias of 10000 (an outlier channel, as real
    networks have) → Relu → conv3 1×1 to a 2-channel map that ignores the ninth channel (its weights are 0).
    The float map is fine; quantized, conv2's output shares one scale (10000/255) across its channels, which
    rounds the eight that matter to zero: the map comes out zero, SQNR 0.0 dB."""
    rng = np.random.default_rng(7)
    w2 = rng.normal(0, 0.5, (9, 8, 1, 1)).astype(np.float32)
    b2 = np.zeros(9, np.float32)
    b2[8] = 10000.0
    w3 = rng.normal(0, 0.5, (2, 9, 1, 1)).astype(np.float32)
    w3[:, 8] = 0.0
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["map"], name="conv3"),
    ]
    initializers = [constant("w1", rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32)), constant("w2", w2),
                    constant("b2", b2), constant("w3", w3)]
    built = model(nodes, [("x", [1, 3, 16, 16])], [("map", [1, 2, 16, 16])], initializers)
    onnx.checker.check_model(built, full_check=True)
    onnx.save(built, str(path))
    return path


def save_map_inputs(path: Path, count: int = 6, seed: int = 7) -> Path:
    np.save(path, np.random.default_rng(seed).normal(0, 1, (count, 3, 16, 16)).astype(np.float32))
    return path
