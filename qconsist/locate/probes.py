"""One small, seeded probe model per row of the table of known non-deterministic operators
(``qconsist.locate.nondeterminism.KNOWN``), and ``verify_row``: run a probe many times in fresh sessions under
each CUDA setting and count the distinct outputs — how each row of the table is verified on a GPU.

A probe's inputs are fixed; a run's output is identified by the exact bytes of every output (the
fingerprint hash), so one distinct output over all runs and sessions means bit-stable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qconsist.inference.fingerprint import tensor_hash
from qconsist.inference.session import ExecutionOptions, create_session
from qconsist.store.serde import serialized

Probe = Callable[[], tuple[onnx.ModelProto, dict[str, np.ndarray]]]


def _model(nodes, inputs, outputs, initializers=(), opset: int = 18, extra_domains=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "probe", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in extra_domains)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="qconsist-probe")
    model.ir_version = 8
    return model


def _f(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def conv_transpose_probe(cin: int = 64, cout: int = 32, size: int = 56, kernel: int = 4, stride: int = 2,
                         pad: int = 1, batch: int = 1) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """FCN-style upsampling: ConvTranspose kernel 4 stride 2 pad 1 (overlapping windows)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.1, (cin, cout, kernel, kernel)).astype(np.float32), "w")
    out = (size - 1) * stride - 2 * pad + kernel
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[kernel, kernel], strides=[stride, stride],
                            pads=[pad] * 4)
    model = _model([node], [_f("x", [batch, cin, size, size])], [_f("y", [batch, cout, out, out])], [w])
    return model, {"x": rng.normal(size=(batch, cin, size, size)).astype(np.float32)}


def conv_probe(channels: int = 64, size: int = 56, batch: int = 1) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.normal(0, 0.1, (channels, channels, 3, 3)).astype(np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    model = _model([node], [_f("x", [batch, channels, size, size])], [_f("y", [batch, channels, size, size])], [w])
    return model, {"x": rng.normal(size=(batch, channels, size, size)).astype(np.float32)}


def _scatter(op: str, reduction: str, data_shape, indices: np.ndarray, updates_shape, axis: int | None = 0):
    rng = np.random.default_rng(2)
    attrs = {"reduction": reduction}
    if axis is not None:
        attrs["axis"] = axis
    node = helper.make_node(op, ["data", "indices", "updates"], ["y"], **attrs)
    model = _model([node], [_f("data", list(data_shape)), _f("updates", list(updates_shape))], [_f("y", list(data_shape))],
                   [numpy_helper.from_array(indices, "indices")])
    feeds = {"data": rng.normal(size=data_shape).astype(np.float32), "updates": rng.normal(size=updates_shape).astype(np.float32)}
    return model, feeds


def scatter_elements_add_probe():
    indices = np.random.default_rng(3).integers(0, 64, (1, 1 << 16)).astype(np.int64)
    return _scatter("ScatterElements", "add", (1, 64), indices, (1, 1 << 16), axis=1)


def scatter_nd_add_probe():
    indices = np.random.default_rng(4).integers(0, 64, (8192, 1)).astype(np.int64)
    return _scatter("ScatterND", "add", (64, 256), indices, (8192, 256), axis=None)


def scatter_repeated_indices_probe():
    indices = np.random.default_rng(5).integers(0, 64, (1, 1 << 16)).astype(np.int64)
    return _scatter("ScatterElements", "none", (1, 64), indices, (1, 1 << 16), axis=1)


def reduce_sum_probe():
    rng = np.random.default_rng(6)
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    model = _model([node], [_f("x", [8192, 512])], [_f("y", [512])], [axes])
    return model, {"x": rng.normal(size=(8192, 512)).astype(np.float32)}


def topk_probe():
    rng = np.random.default_rng(7)
    k = numpy_helper.from_array(np.array([1000], np.int64), "k")
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=-1)
    outputs = [_f("values", [1, 1000]), helper.make_tensor_value_info("indices", TensorProto.INT64, [1, 1000])]
    model = _model([node], [_f("x", [1, 1 << 16])], outputs, [k])
    return model, {"x": rng.integers(0, 8, (1, 1 << 16)).astype(np.float32)}  # many ties: which index comes first


def group_norm_probe():
    rng = np.random.default_rng(8)
    channels = 64
    gamma = numpy_helper.from_array(rng.normal(1, 0.1, channels).astype(np.float32), "gamma")
    beta = numpy_helper.from_array(rng.normal(0, 0.1, channels).astype(np.float32), "beta")
    node = helper.make_node("GroupNorm", ["x", "gamma", "beta"], ["y"], domain="com.microsoft", epsilon=1e-5,
                            groups=32, activation=0, channels_last=1)
    model = _model([node], [_f("x", [1, 64, 64, channels])], [_f("y", [1, 64, 64, channels])], [gamma, beta],
                   extra_domains=("com.microsoft",))
    return model, {"x": rng.normal(size=(1, 64, 64, channels)).astype(np.float32)}


def random_normal_probe():
    node = helper.make_node("RandomNormal", [], ["y"], shape=[1, 1024], dtype=TensorProto.FLOAT)
    return _model([node], [], [_f("y", [1, 1024])]), {}


PROBES: dict[str, Probe] = {
    "conv_transpose_overlapping_windows": conv_transpose_probe,
    "scatter_elements_atomic_reduction": scatter_elements_add_probe,
    "scatter_nd_atomic_reduction": scatter_nd_add_probe,
    "scatter_repeated_indices": scatter_repeated_indices_probe,
    "reduce_sum_leading_axes": reduce_sum_probe,
    "topk_radix": topk_probe,
    "group_norm": group_norm_probe,
    "conv_algorithm_autotune": conv_probe,
    "random_operators": random_normal_probe,
}


@serialized(derived=("stable",))
@dataclass
class Stability:
    """Distinct outputs of one probe under one execution setting, over ``sessions`` × ``runs``."""

    setting: str
    sessions: int
    runs: int
    distinct: int  # over every run of every session
    distinct_per_session: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def stable(self) -> bool:
        return self.error is None and self.distinct == 1


def measure_stability(model: onnx.ModelProto, feeds: dict[str, np.ndarray], options: ExecutionOptions, setting: str,
                      sessions: int = 3, runs: int = 20) -> Stability:
    """Fresh sessions of ``model`` run ``runs`` times each; the distinct outputs, per session and over all."""
    data = model.SerializeToString()
    seen: set[tuple[int, ...]] = set()
    per_session = []
    try:
        for _ in range(sessions):
            session = create_session(data, options)
            mine: set[tuple[int, ...]] = set()
            for _ in range(runs):
                key = tuple(tensor_hash(np.asarray(o)) for o in session.run(None, feeds))
                mine.add(key)
            seen |= mine
            per_session.append(len(mine))
    except Exception as exc:  # noqa: BLE001 - a probe the EP cannot run is reported, not fatal
        return Stability(setting, sessions, runs, len(seen), per_session, " ".join(str(exc).split())[:200])
    return Stability(setting, sessions, runs, len(seen), per_session)


def cuda_settings(deterministic: bool = False) -> dict[str, ExecutionOptions]:
    """The three cuDNN searches with TF32 off (and deterministic compute as asked)."""
    return {
        f"{search}/tf32=0" + ("/deterministic=1" if deterministic else ""): ExecutionOptions(
            "cuda", {"cudnn_conv_algo_search": search, "use_tf32": False}, deterministic_compute=deterministic or None)
        for search in ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")
    }


def verify_row(row_id: str, sessions: int = 3, runs: int = 20) -> list[Stability]:
    """The row's probe under each CUDA setting (and with deterministic compute)."""
    model, feeds = PROBES[row_id]()
    settings = {**cuda_settings(False), **cuda_settings(True)}
    return [measure_stability(model, feeds, options, label, sessions, runs) for label, options in settings.items()]
