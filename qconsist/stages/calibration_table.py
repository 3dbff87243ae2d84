"""The calibration table of a quantized model: per quantized tensor its range, scale, zero point, nodes.

Read from the quantized model itself: the scale and zero-point inputs of its QuantizeLinear /
DequantizeLinear / QLinear* nodes (at the positions the operators' schemas give them, ``QLINEAR_PARAMETERS``;
never an initializer found by its name: a Caffe BatchNorm's gamma is ``<layer>_scale`` too), mapped to the
tensors they quantize and to the nodes that consume those tensors plus the ranges calibration measured. Validation reports every NaN,
infinite, zero or negative scale with its tensor and nodes.

Non-finite scales stay floats here; the JSON serializer (``qconsist.store.serde``) writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from qconsist.onnxfile import node_label
from qconsist.store.serde import serialized, to_number

_QDQ = ("QuantizeLinear", "DequantizeLinear")

# Where a quantized operator takes its quantization parameters, from its schema (ONNX's, and onnxruntime's
# com.microsoft ops): per quantized tensor, (its input index, or None for the operator's output 0; the scale's
# input index; the zero point's input index).
_BINARY = ((0, 1, 2), (3, 4, 5), (None, 6, 7))
_UNARY = ((0, 1, 2), (None, 3, 4))
QLINEAR_PARAMETERS: dict[str, tuple[tuple[int | None, int, int], ...]] = {
    "QuantizeLinear": ((0, 1, 2),), "DequantizeLinear": ((0, 1, 2),),
    "QLinearConv": _BINARY, "QLinearMatMul": _BINARY, "QLinearAdd": _BINARY, "QLinearMul": _BINARY,
    "QGemm": ((0, 1, 2), (3, 4, 5), (None, 7, 8)),
    "QLinearSigmoid": _UNARY, "QLinearLeakyRelu": _UNARY, "QLinearSoftmax": _UNARY, "QLinearAveragePool": _UNARY,
    "QLinearGlobalAveragePool": _UNARY, "QLinearReduceMean": _UNARY,
    "QLinearWhere": ((1, 2, 3), (4, 5, 6), (None, 7, 8)),
    "QLinearConcat": ((None, 0, 1), *((i, i + 1, i + 2) for i in range(2, 2 + 3 * 64, 3))),
}


def quantization_parameters(model: onnx.ModelProto) -> set[str]:
    """The names of every scale and zero point of ``model``: the inputs its QuantizeLinear, DequantizeLinear and
    QLinear* nodes take at their schemas' scale and zero-point positions (read from the graph, never by name)."""
    found: set[str] = set()
    for node in model.graph.node:
        inputs = list(node.input)
        for _, scale, zero_point in QLINEAR_PARAMETERS.get(node.op_type, ()):
            found.update(inputs[i] for i in (scale, zero_point) if i < len(inputs) and inputs[i])
    return found


def quantized_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes that make a model quantized: QuantizeLinear / DequantizeLinear and ONNX's or onnxruntime's
    QLinear* / integer operators (``QLinearConv``, ``ConvInteger``, ``DynamicQuantizeLinear``…)."""
    return [n for n in model.graph.node if n.op_type in _QDQ or n.op_type.startswith("QLinear")
            or n.op_type.endswith("Integer") or n.op_type == "DynamicQuantizeLinear"]


@dataclass(frozen=True)
class TableEntry:
    """One quantized tensor."""

    tensor: str
    kind: str  # "activation" | "weight" | "bias"
    scale_initializer: str
    zero_point_initializer: str | None
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    quant_type: str
    nodes: tuple[str, ...]
    range_min: float | None = None
    range_max: float | None = None
    per_channel: bool = False
    data_initializer: str | None = None  # weights and biases: the quantized values

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "min": None if self.range_min is None else float(self.range_min),
            "max": None if self.range_max is None else float(self.range_max),
            "scale": [float(v) for v in self.scale] if self.per_channel else float(self.scale[0]),
            "zero_point": list(self.zero_point) if self.per_channel else self.zero_point[0],
            "quant_type": self.quant_type,
            "scale_initializer": self.scale_initializer,
            "zero_point_initializer": self.zero_point_initializer,
            "data_initializer": self.data_initializer,
            "nodes": list(self.nodes),
        }

    @classmethod
    def from_json(cls, tensor: str, data: dict[str, Any]) -> "TableEntry":
        scale = data["scale"]
        zero = data["zero_point"]
        per_channel = isinstance(scale, list)
        return cls(
            tensor=tensor, kind=data["kind"], scale_initializer=data["scale_initializer"],
            zero_point_initializer=data.get("zero_point_initializer"),
            scale=tuple(to_number(v) for v in scale) if per_channel else (to_number(scale),),
            zero_point=tuple(int(v) for v in zero) if isinstance(zero, list) else (int(zero),),
            quant_type=data.get("quant_type", ""), nodes=tuple(data.get("nodes", [])),
            range_min=None if data.get("min") is None else to_number(data["min"]),
            range_max=None if data.get("max") is None else to_number(data["max"]),
            per_channel=per_channel, data_initializer=data.get("data_initializer"),
        )


@serialized(derived=("message",))
@dataclass(frozen=True)
class ScaleIssue:
    """A quantization parameter that makes the model wrong: NaN, infinite, zero or negative scale."""

    tensor: str
    nodes: tuple[str, ...]
    scale_initializer: str
    problem: str  # "nan" | "inf" | "zero" | "negative"
    channels: int  # how many values of the scale have the problem

    def message(self) -> str:
        where = ", ".join(self.nodes) or "nothing"
        words = {"nan": "a NaN", "inf": "an infinite", "zero": "a zero", "negative": "a negative"}[self.problem]
        return (
            f"tensor '{self.tensor}' (consumed by {where}) has {words} scale in "
            f"'{self.scale_initializer}' ({self.channels} value(s))"
        )


@dataclass
class CalibrationTable:
    entries: dict[str, TableEntry] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {name: entry.to_json() for name, entry in self.entries.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CalibrationTable":
        return cls({name: TableEntry.from_json(name, value) for name, value in data.items()})

    def by_initializer(self) -> dict[str, list[TableEntry]]:
        """Entries by the name of their scale, zero-point or data initializer (tensors can share a scale:
        a MaxPool output is quantized with its input's)."""
        index: dict[str, list[TableEntry]] = {}
        for entry in self.entries.values():
            for name in (entry.scale_initializer, entry.zero_point_initializer, entry.data_initializer):
                if name:
                    index.setdefault(name, []).append(entry)
        return index

    def issues(self) -> list[ScaleIssue]:
        found = []
        for entry in self.entries.values():
            scale = np.asarray(entry.scale, dtype=np.float64)
            for problem, mask in (
                ("nan", np.isnan(scale)), ("inf", np.isinf(scale)), ("zero", scale == 0), ("negative", scale < 0),
            ):
                if mask.any():
                    found.append(ScaleIssue(entry.tensor, entry.nodes, entry.scale_initializer, problem, int(mask.sum())))
        return found


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            if name:
                users.setdefault(name, []).append(node)
    return users


def _labels(graph: onnx.GraphProto) -> dict[int, str]:
    """Each node's label by ``id``: its name, or the invented one marked as such (``onnxfile.node_label``)."""
    return {id(node): node_label(node, i) for i, node in enumerate(graph.node)}


def _downstream(output: str, users: dict[str, list[onnx.NodeProto]], outputs: frozenset[str] = frozenset(),
                labels: dict[int, str] | None = None) -> list[str]:
    """Nodes using a tensor, looking through QuantizeLinear/DequantizeLinear to the real consumers.

    A graph output is listed as ``<output NAME>``; a node by its label in ``labels`` (``_labels``: an unnamed
    node's invented name, marked as such).
    """
    found: list[str] = []
    pending, seen = [output], set()
    while pending:  # iterative, and each tensor once: a graph ORT quantized twice chains Q/DQ pairs
        tensor = pending.pop(0)
        if tensor in seen:
            continue
        seen.add(tensor)
        if tensor in outputs:
            found.append(f"<output {tensor}>")
        for node in users.get(tensor, []):
            if node.op_type in _QDQ:
                pending.extend(node.output)
            else:
                found.append(labels[id(node)] if labels is not None else node.name or node.op_type)
    return found


def build_table(model: onnx.ModelProto, ranges: dict[str, tuple[float, float]] | None = None) -> CalibrationTable:
    """Map every scale/zero-point initializer of a quantized model to its tensor, values and consumers."""
    ranges = ranges or {}
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    users = _consumers(graph)
    outputs = frozenset(o.name for o in graph.output)
    table = CalibrationTable()

    labels = _labels(graph)

    def downstream(name: str) -> list[str]:
        return _downstream(name, users, outputs, labels)

    def add(tensor: str, kind: str, scale_name: str, zp_name: str | None, nodes: list[str], data: str | None = None) -> None:
        if tensor in table.entries or scale_name not in inits:
            return
        scale = numpy_helper.to_array(inits[scale_name]).astype(np.float64)
        zp_array = numpy_helper.to_array(inits[zp_name]) if zp_name and zp_name in inits else np.zeros_like(scale, dtype=np.int64)
        quant_type = str(zp_array.dtype)
        low_high = ranges.get(tensor)
        table.entries[tensor] = TableEntry(
            tensor=tensor, kind=kind, scale_initializer=scale_name,
            zero_point_initializer=zp_name if zp_name in inits else None,
            scale=tuple(float(v) for v in scale.reshape(-1)), zero_point=tuple(int(v) for v in zp_array.reshape(-1)),
            quant_type=quant_type, nodes=tuple(sorted(set(nodes))),
            range_min=None if low_high is None else float(low_high[0]),
            range_max=None if low_high is None else float(low_high[1]),
            per_channel=scale.ndim > 0 and scale.size > 1, data_initializer=data,
        )

    for node in graph.node:
        if node.op_type not in _QDQ or len(node.input) < 2:
            continue
        zp = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if node.op_type == "QuantizeLinear":
            # ORT renames a quantized graph output's producer to "<output>_QuantizeLinear_Input"
            tensor = node.input[0].removesuffix("_QuantizeLinear_Input")
            add(tensor, "activation", node.input[1], zp, downstream(node.output[0]))
        elif node.input[0] in inits:
            data = node.input[0]
            kind = "bias" if inits[data].data_type == onnx.TensorProto.INT32 else "weight"
            tensor = data[: -len("_quantized")] if data.endswith("_quantized") else node.output[0]
            add(tensor, kind, node.input[1], zp, downstream(node.output[0]), data)
    # QOperator format: QLinear* nodes take their scales and zero points as inputs, at the positions their
    # schemas give (never an initializer found by its name: a Caffe BatchNorm's gamma is "<layer>_scale" too)
    for node in graph.node:
        for data_index, scale_index, zp_index in QLINEAR_PARAMETERS.get(node.op_type, ()):
            inputs = list(node.input)
            scale_name = inputs[scale_index] if scale_index < len(inputs) else ""
            if not scale_name or scale_name not in inits or any(e.scale_initializer == scale_name for e in table.entries.values()):
                continue
            zp_name = inputs[zp_index] if zp_index < len(inputs) and inputs[zp_index] in inits else None
            quantized = (inputs[data_index] if data_index is not None and data_index < len(inputs) else node.output[0])
            # ORT names a QOperator tensor's parameters "<tensor>_scale" / "<tensor>_zero_point": the tensor's name
            tensor = scale_name[: -len("_scale")] if scale_name.endswith("_scale") else quantized
            users_of = users.get(scale_name, [])
            nodes = [labels[id(n)] for n in users_of if n.op_type not in _QDQ]
            nodes += [d for n in users_of if n.op_type in _QDQ for d in downstream(n.output[0])]
            base = tensor[: -len("_quantized")] if tensor.endswith("_quantized") else tensor
            kind = "activation"
            if tensor in inits or f"{tensor}_quantized" in inits or tensor.endswith("_quantized"):
                stored = inits.get(tensor) or inits.get(f"{tensor}_quantized")
                kind = "bias" if stored is not None and stored.data_type == onnx.TensorProto.INT32 else "weight"
            data = next((n for n in (tensor, f"{tensor}_quantized") if n in inits), None) if kind != "activation" else None
            add(base, kind, scale_name, zp_name, nodes, data)
    return table
