"""Small ONNX models built in code for issue 27's items 6, 7, 9 and 11 (how outputs and figures are judged,
calibration parameters read from the graph, true statements), seeded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _save(nodes, inputs, outputs, inits, path: Path, opsets=(("", 13),), ir_version: int = 7, name: str = "judge") -> Path:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], producer_name="qconsist-tests")
    model.ir_version = ir_version
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def batchnorm_negative_gamma(path: Path, output: str = "bn_out") -> Path:
    """Conv → Relu → BatchNormalization whose gamma ``bn_scale`` (caffe2onnx's name for a Caffe BatchNorm's
    scale) holds negative values, → Conv: ORT cannot fuse the BatchNorm (a Relu lies between), so it stays in the
    quantized model (where it is excluded from quantization) with its gamma, an initializer named ``*_scale`` that is no
    quantization parameter. ``output``: the BatchNorm's output; ``"bn"`` makes onnxruntime's quantizer name that
    tensor's scale ``bn_scale`` too, and reuse the gamma as its scale (a real negative scale)."""
    rng = np.random.default_rng(11)
    gamma = np.array([0.8, -0.5, 1.2, -1.1], dtype=np.float32)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "b1"),
        numpy_helper.from_array(gamma, "bn_scale"),
        numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "bn_bias"),
        numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "bn_mean"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, (4,)).astype(np.float32), "bn_var"),
        numpy_helper.from_array(rng.normal(0, 0.3, (2, 4, 3, 3)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("BatchNormalization", ["r1", "bn_scale", "bn_bias", "bn_mean", "bn_var"], [output], name="bn"),
        helper.make_node("Conv", [output, "w2"], ["out"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    return _save(nodes, [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
                 [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 2, 8, 8])], inits, path)


def conv_relu(path: Path, opsets=(("", 12),), names: bool = True) -> Path:
    """Conv → Relu → Conv → Sigmoid on a 1×3×8×8 input, seeded; ``opsets``: the model's opset_import entries in
    order; ``names`` False: every node unnamed, as a PyTorch export's often are."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.3, (2, 4, 3, 3)).astype(np.float32), "w2")]
    nodes = [
        helper.make_node("Conv", ["input", "w1"], ["c1"], name="conv1" if names else "", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1" if names else ""),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2" if names else "", pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["out"], name="sigmoid" if names else ""),
    ]
    return _save(nodes, [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
                 [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 2, 8, 8])], inits, path, opsets=opsets)


def identical_and_zero_branch(path: Path) -> Path:
    """x → Mul ("scaled") → Conv → Relu ("relu", quantized), and beside it a branch left in float: "side" =
    x·2, "small" = side·0.001, "zeros" = small·0 (all zero), reduced and added back: ``out = relu + mean(zeros)``.
    Quantized with ``op_types = ["Conv"]``, the branch is computed in float in both models: identical tensors
    (ORT's SQNR formula gives them the float epsilon's 300-odd dB, lower for "small" than for "side": 60 dB
    "added"), and "zeros" has no signal (0 dB by that formula)."""
    rng = np.random.default_rng(13)
    inits = [numpy_helper.from_array(np.array(1.5, dtype=np.float32), "k"),
             numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"),
             numpy_helper.from_array(np.array(0.001, dtype=np.float32), "tiny"),
             numpy_helper.from_array(np.array(0.0, dtype=np.float32), "nothing"),
             numpy_helper.from_array(rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32), "w")]
    nodes = [
        helper.make_node("Mul", ["input", "k"], ["scaled"], name="scale"),
        helper.make_node("Conv", ["scaled", "w"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("Mul", ["input", "two"], ["side"], name="double"),
        helper.make_node("Mul", ["side", "tiny"], ["small"], name="shrink"),
        helper.make_node("Mul", ["small", "nothing"], ["zeros"], name="zero"),
        helper.make_node("ReduceMean", ["zeros"], ["zero_mean"], name="mean", axes=[1], keepdims=1),
        helper.make_node("Add", ["relu", "zero_mean"], ["out"], name="add"),
    ]
    return _save(nodes, [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
                 [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 8, 8])], inits, path)


def sequence_and_class(path: Path, shift: float = 0.0) -> Path:
    """A text-recogniser-like pair of outputs from one input x (N, 8): first "seq" (N, 5, 6), a Softmax over
    axis 2 (six classes at each of five positions: a map whose class axis the graph gives), then "prob" (N, 4),
    a Softmax over axis 1 (class scores). ``shift``: added to the sequence weights (another model's numerics)."""
    rng = np.random.default_rng(17)
    w_seq = rng.normal(0, 1.0, (8, 30)).astype(np.float32)
    w_seq += np.float32(shift) * rng.normal(0, 1.0, (8, 30)).astype(np.float32)
    inits = [numpy_helper.from_array(w_seq, "w_seq"),
             numpy_helper.from_array(np.array([-1, 5, 6], dtype=np.int64), "seq_shape"),
             numpy_helper.from_array(rng.normal(0, 1.0, (8, 4)).astype(np.float32), "w_cls")]
    nodes = [
        helper.make_node("MatMul", ["x", "w_seq"], ["seq_flat"], name="seq_fc"),
        helper.make_node("Reshape", ["seq_flat", "seq_shape"], ["seq_logits"], name="seq_reshape"),
        helper.make_node("Softmax", ["seq_logits"], ["seq"], name="seq_softmax", axis=2),
        helper.make_node("MatMul", ["x", "w_cls"], ["logits"], name="cls_fc"),
        helper.make_node("Softmax", ["logits"], ["prob"], name="cls_softmax", axis=1),
    ]
    return _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                 [helper.make_tensor_value_info("seq", TensorProto.FLOAT, [1, 5, 6]),
                  helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 4])], inits, path)
