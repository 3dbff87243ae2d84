"""Float models built in code whose optimized graph holds NCHWc-blocked tensors (onnxruntime's NchwcTransformer, CPU
EP, level all), with integer weights and inputs so that every product and sum is exact in float32: any processor's
kernels compute the same bits, and only the layout (blocks of 16 under AVX-512F, of 8 under AVX2) differs.

``aligned_model``: 16 channels throughout (a multiple of both blocks, so ORT's graph has the same structure on both
processors): MaxPool 3×3 → Conv 1×1 16→32 + Relu → Conv 3×3 32→16. ``padded_model``: 20 channels (padded to 32 or
24): Conv 3×3 20→20 + Relu → Conv 1×1 20→12, plus a Conv 1×1 4→12 of a second input of 4 channels (fewer than a
block: ORT reads it in NCHW, its filter in OIHWBo), the two summed (ORT fuses the sum into a Conv).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZE = 8


def _save(nodes, inputs, outputs, initializers, path: Path, name: str) -> Path:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _weights(rng, shape) -> np.ndarray:
    return rng.integers(-2, 3, shape).astype(np.float32)


def aligned_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2816)
    return {"w1": _weights(rng, (32, 16, 1, 1)), "b1": _weights(rng, (32,)), "w2": _weights(rng, (16, 32, 3, 3)),
            "b2": _weights(rng, (16,))}


def aligned_model(path: Path) -> Path:
    w = aligned_weights()
    nodes = [
        helper.make_node("MaxPool", ["x"], ["pool"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["pool", "w1", "b1"], ["conv1"], name="conv1"),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node("Conv", ["relu1", "w2", "b2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    return _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, SIZE, SIZE])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, SIZE, SIZE])],
                 [numpy_helper.from_array(v, k) for k, v in w.items()], path, "nchwc_aligned")


def padded_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2820)
    return {"w1": _weights(rng, (20, 20, 3, 3)), "b1": _weights(rng, (20,)), "w2": _weights(rng, (12, 20, 1, 1)),
            "b2": _weights(rng, (12,)), "w3": _weights(rng, (12, 4, 1, 1)), "b3": _weights(rng, (12,))}


def padded_model(path: Path) -> Path:
    w = padded_weights()
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["conv1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node("Conv", ["relu1", "w2", "b2"], ["conv2"], name="conv2"),
        helper.make_node("Conv", ["z", "w3", "b3"], ["conv3"], name="conv3"),
        helper.make_node("Add", ["conv2", "conv3"], ["y"], name="sum"),
    ]
    return _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 20, SIZE, SIZE]),
                         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, SIZE, SIZE])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12, SIZE, SIZE])],
                 [numpy_helper.from_array(v, k) for k, v in w.items()], path, "nchwc_padded")


def integer_inputs(path: Path, channels: int, count: int = 2) -> Path:
    """``count`` samples of small integers: every sum the models compute is exact in float32 (``padded_model``: an
    .npz with its second input ``z`` too)."""
    rng = np.random.default_rng(channels)
    x = rng.integers(-4, 5, (count, channels, SIZE, SIZE)).astype(np.float32)
    if path.suffix == ".npz":
        np.savez(path, x=x, z=rng.integers(-4, 5, (count, 4, SIZE, SIZE)).astype(np.float32))
    else:
        np.save(path, x)
    return path


def conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, pad: int) -> np.ndarray:
    """A reference NCHW convolution (stride 1) in float64: exact for these integers."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    o, _, kh, kw = w.shape
    n, _, h, wd = x.shape
    out = np.zeros((n, o, h - kh + 1, wd - kw + 1))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", x[:, :, i:i + out.shape[2], j:j + out.shape[3]], w[:, :, i, j])
    return out + b[None, :, None, None]
