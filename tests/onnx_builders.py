"""Small ONNX models built in code, seeded: around one ConvTranspose or one scatter (the determinize tests and
``benchmarks/determinize_gpu.py``, with the geometries they share), and the small classifier and Pad→MaxPool
models of the pipeline, stage, calibration and batch tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pathlib import Path

# id -> conv_transpose_model arguments (16 -> 8 channels on 14x14 unless given)
CONV_TRANSPOSE_GEOMETRIES = {
    "k4s2p1": {},
    "k8s4p2": {"kernel": (8, 8), "strides": (4, 4), "pads": (2, 2, 2, 2)},
    "k16s8p4": {"kernel": (16, 16), "strides": (8, 8), "pads": (4, 4, 4, 4), "size": (7, 7)},
    "k3s2p1 output_padding 1": {"kernel": (3, 3), "pads": (1, 1, 1, 1), "output_padding": (1, 1)},
    "k4s2p0 + crop 1 (folded)": {"pads": (0, 0, 0, 0), "crop": ([1, 1], [29, 29])},
    "k8s4p0 + crop 2 (folded)": {"kernel": (8, 8), "strides": (4, 4), "pads": (0, 0, 0, 0), "crop": ([2, 2], [58, 58])},
    "k4s2p0 uncropped": {"pads": (0, 0, 0, 0)},
    "no bias": {"bias": False},
    "batch 3": {"batch": 3},
    "non-square input": {"size": (7, 12)},
    "non-square kernel and stride": {"kernel": (4, 3), "strides": (2, 3), "pads": (1, 0, 1, 0), "size": (7, 9)},
    "kernel 5 stride 2 (not a multiple)": {"kernel": (5, 5), "pads": (2, 2, 2, 2), "output_padding": (1, 1)},
    "asymmetric pads": {"kernel": (5, 5), "pads": (2, 1, 0, 3), "output_padding": (1, 0)},
    "pads beyond the kernel": {"pads": (5, 4, 6, 3)},
    "dilation 2": {"kernel": (3, 3), "pads": (0, 0, 0, 0), "dilations": (2, 2)},
    "group 2": {"group": 2},
    "depthwise": {"cin": 8, "cout": 8, "group": 8},
    "stride 1": {"kernel": (3, 3), "strides": (1, 1)},
}


def conv_transpose_model(cin=16, cout=8, size=(14, 14), kernel=(4, 4), strides=(2, 2), pads=(1, 1, 1, 1), *, batch=1,
                         output_padding=None, dilations=None, group=1, bias=True, crop=None, seed=0, opset=17,
                         attributes=None) -> onnx.ModelProto:
    """x (batch, cin, *size) -> ConvTranspose 'up' [-> Slice 'crop' on the spatial axes] -> y."""
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((cin, cout // group, *kernel)) / np.sqrt(cin * kernel[0] * kernel[1] / 4)).astype(np.float32)
    initializers = [numpy_helper.from_array(weight, "W")]
    inputs = ["x", "W"]
    if bias:
        initializers.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "B"))
        inputs.append("B")
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "group": group, **(attributes or {})}
    if pads is not None:
        attrs["pads"] = list(pads)
    if output_padding:
        attrs["output_padding"] = list(output_padding)
    if dilations:
        attrs["dilations"] = list(dilations)
    nodes = [helper.make_node("ConvTranspose", inputs, ["up" if crop else "y"], name="up", **attrs)]
    if crop:
        starts, ends = crop
        initializers += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                         (("crop_starts", starts), ("crop_ends", ends), ("crop_axes", [2, 3]))]
        nodes.append(helper.make_node("Slice", ["up", "crop_starts", "crop_ends", "crop_axes"], ["y"], name="crop"))
    graph = helper.make_graph(nodes, "conv_transpose", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, cin, *size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)



def scatter_model(data, indices, axis=0, reduction="add", op="ScatterElements", constant_indices=None) -> onnx.ModelProto:
    """data (float) and updates (float, the shape of indices) as inputs; indices an input or a constant."""
    attrs = {"reduction": reduction} if op == "ScatterND" else {"axis": axis, "reduction": reduction}
    node = helper.make_node(op, ["data", "indices", "updates"], ["y"], name="scatter", **attrs)
    update_shape = indices if op == "ScatterElements" else list(indices[:-1]) + list(data[indices[-1]:])
    inputs = [helper.make_tensor_value_info("data", TensorProto.FLOAT, data),
              helper.make_tensor_value_info("updates", TensorProto.FLOAT, update_shape)]
    initializers = []
    if constant_indices is None:
        inputs.append(helper.make_tensor_value_info("indices", TensorProto.INT64, indices))
    else:
        initializers.append(numpy_helper.from_array(constant_indices, "indices"))
    graph = helper.make_graph([node], "scatter", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, data)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def build_pad_pool_model(path: Path, pad_value: float = float("-inf")) -> Path:
    """Conv → Relu → Pad(constant ``pad_value``) → MaxPool on a 1×3×8×8 input: the pattern caffe2onnx
    emits for Caffe's padded max pooling. With -inf, calibration yields infinite scales."""
    rng = np.random.default_rng(0)
    initializers = [
        numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "B"),
        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
        numpy_helper.from_array(np.array(pad_value, np.float32), "pad_value"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("Pad", ["relu", "pads", "pad_value"], ["padded"], name="pad", mode="constant"),
        helper.make_node("MaxPool", ["padded"], ["y"], name="pool", kernel_shape=[3, 3], strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes, "pad_pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="qconsist-tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def build_classifier_model(path: Path, batch: int | str = 1, fc_bias: list[float] | None = None) -> Path:
    """Conv → Relu → GlobalAveragePool → Flatten → Gemm → Softmax on a batch×3×8×8 input, 5 classes
    (``batch`` a number, or a name for a dynamic batch; ``fc_bias`` replaces the last layer's bias)."""
    rng = np.random.default_rng(1)
    initializers = [
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32), "conv_w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "conv_b"),
        numpy_helper.from_array(rng.normal(0, 0.5, (5, 8)).astype(np.float32), "fc_w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (5,)).astype(np.float32) if fc_bias is None
                                else np.array(fc_bias, np.float32), "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("GlobalAveragePool", ["relu"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [batch, 5])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="qconsist-tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def save_arrays(path: Path, count: int, seed: int, shape: tuple[int, ...] = (3, 8, 8)) -> Path:
    """``count`` seeded normal samples stacked in a .npy file."""
    np.save(path, np.random.default_rng(seed).normal(0, 1, (count, *shape)).astype(np.float32))
    return path


def small_convnet(path: Path) -> Path:
    """Conv → Relu → Conv → Relu → GlobalAveragePool → Flatten → Gemm → Softmax, weights seeded."""
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "b2"),
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 4)).astype(np.float32), "w3"),
        numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "b3"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], name="fc"),
        helper.make_node("Softmax", ["logits"], ["prob"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "small_convnet", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 4])], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="qconsist-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def prelu_conv_model(channels: int = 10, height: int = 10, width: int = 10, *, kernel: int = 3, stride: int = 1,
                     cin: int = 3, pool: bool = True, seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """A P-Net-like stage: Conv (cin → ``channels``, ``kernel``, ``stride``, no pad) → PRelu → [MaxPool 1×1] →
    Conv 1×1 (→ 4) → PRelu → Conv 1×1 (→ 2) on an input sized so that the first conv's output is
    ``channels`` × ``height`` × ``width``. Quantized (QDQ), ORT's NHWC transformer runs the convs channels last and
    moves its Transposes through the DequantizeLinear and PRelu after them, which keep their names: with
    C == H == W the NHWC tensors have the NCHW shapes."""
    rng = np.random.default_rng(seed)
    size = ((height - 1) * stride + kernel, (width - 1) * stride + kernel)

    def conv(name, cin_, cout, k, x, y, **attrs):
        weight = (rng.standard_normal((cout, cin_, k, k)) / np.sqrt(cin_ * k * k)).astype(np.float32)
        bias = rng.normal(0, 0.1, cout).astype(np.float32)
        inits.extend([numpy_helper.from_array(weight, f"{name}_w"), numpy_helper.from_array(bias, f"{name}_b")])
        nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [y], name=name, kernel_shape=[k, k], **attrs))

    def prelu(name, c, x, y):
        inits.append(numpy_helper.from_array(rng.uniform(0.05, 0.3, (c, 1, 1)).astype(np.float32), f"{name}_slope"))
        nodes.append(helper.make_node("PRelu", [x, f"{name}_slope"], [y], name=name))

    inits: list = []
    nodes: list = []
    conv("conv1", cin, channels, kernel, "x", "conv1_out", strides=[stride, stride])
    prelu("prelu1", channels, "conv1_out", "prelu1_out")
    after = "prelu1_out"
    if pool:
        nodes.append(helper.make_node("MaxPool", ["prelu1_out"], ["pool1_out"], name="pool1", kernel_shape=[1, 1]))
        after = "pool1_out"
    conv("conv2", channels, 4, 1, after, "conv2_out")
    prelu("prelu2", 4, "conv2_out", "prelu2_out")
    conv("conv3", 4, 2, 1, "prelu2_out", "y")
    graph = helper.make_graph(nodes, "prelu_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, *size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, height, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="qconsist-tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def build_unet_model(path: Path, upsample: bool = True) -> Path:
    """An encoder-decoder on a 1×3×h×w input of any height and width: two stride-2 convolutions, then (with
    ``upsample``) two nearest ×2 Resizes, each added to the encoder's tensor of its size — a model that takes
    multiples of 4 (otherwise a classifier head: GlobalAveragePool, any size)."""
    rng = np.random.default_rng(3)
    weights = {"w1": (4, 3, 3, 3), "w2": (4, 4, 3, 3), "w0": (4, 3, 1, 1)}
    initializers = [numpy_helper.from_array(rng.normal(0, 0.5, shape).astype(np.float32), name) for name, shape in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["d1"], name="down1", strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["d1", "w2"], ["d2"], name="down2", strides=[2, 2], pads=[1, 1, 1, 1]),
    ]
    if upsample:
        nodes += [
            helper.make_node("Resize", ["d2", "", "scales"], ["u1"], name="up1", mode="nearest"),
            helper.make_node("Add", ["u1", "d1"], ["m1"], name="merge1"),
            helper.make_node("Resize", ["m1", "", "scales"], ["u0"], name="up0", mode="nearest"),
            helper.make_node("Conv", ["x", "w0"], ["s0"], name="skip0"),
            helper.make_node("Add", ["u0", "s0"], ["y"], name="merge0"),
        ]
        output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "h", "w"])
    else:
        nodes.append(helper.make_node("GlobalAveragePool", ["d2"], ["y"], name="gap"))
        output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 1, 1])
    graph = helper.make_graph(nodes, "unet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                              [output], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="qconsist-tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path
