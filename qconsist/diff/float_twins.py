"""Which float tensor each tensor observed in a quantized model's run stands for, and how to read its value.

Traced through the quantized model as the quantizer wrote it: a DequantizeLinear output stands for its
QuantizeLinear's input (``relu_1_DequantizeLinear_Output`` → ``relu_1``; one that kept a float tensor's name, as a
renamed graph output does, for that tensor); an integer tensor of a fused kernel (QLinearConv's ``conv_1``)
for the float tensor quantized where its value goes (``conv_1`` → Relu → QuantizeLinear: ``relu_1``), a QOperator
model's ``<name>_quantized`` for ``<name>``, and forward through a Relu or Clip the quantizer folded away; an
integer tensor is dequantized with the scale and zero point ORT's own graph gives it (its DequantizeLinear
consumer's, or its producer's output parameters); every observed tensor is put back in its float twin's axis order
where ORT held it in another (an NHWC QLinearConv, a DequantizeLinear or PRelu the NHWC transformer moved a
Transpose through), the permutation read from the graph (``inference/layout.py``), never guessed from shapes — a
tensor whose layout cannot be established is left out; a float
tensor computed by the quantized graph keeps its name when the same op computes it in the float model.
Constants (dequantized weights and biases) are counted and left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from qconsist.onnxfile import node_label
from qconsist.inference.dump import DumpPlan
from qconsist.inference.graphmap import implicit_inputs
from qconsist.inference.layout import describe, to_original

# Where a quantized kernel's output scale and zero point are among its inputs (onnx and com.microsoft ops).
_OUTPUT_PARAMS = {
    "QuantizeLinear": (1, 2), "QLinearConv": (6, 7), "QLinearAdd": (6, 7), "QLinearMul": (6, 7),
    "QLinearMatMul": (6, 7), "QGemm": (7, 8), "QLinearGlobalAveragePool": (3, 4), "QLinearAveragePool": (3, 4),
    "QLinearSigmoid": (3, 4), "QLinearLeakyRelu": (3, 4), "QLinearSoftmax": (3, 4), "QLinearConcat": (0, 1),
}
# Integer ops that move values without changing them: their output has their input's scale and zero point.
_PASS_THROUGH = {"Transpose", "Reshape", "MaxPool", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Split"}
# Float ops the quantizer folds into the quantization of their input (a Relu after a Conv quantized as one).
_FOLDED = {"Relu", "Clip"}
_QOPERATOR_SUFFIX = "_quantized"  # onnxruntime's QOperator quantizer names a quantized tensor <float name>_quantized


class Graph:
    """Producers, consumers and constants of one graph."""

    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.nodes = list(graph.node)
        self.producer = {out: node for node in graph.node for out in node.output if out}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.constants = {init.name: init for init in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if attr.name == "value":
                        self.constants[node.output[0]] = attr.t
        self.tensors = set(self.producer) | {i.name for i in graph.input}
        self.by_name = {node.name: node for node in graph.node if node.name}

    def op(self, name: str) -> str | None:
        node = self.producer.get(name)
        return node.op_type if node is not None else None

    def scalar(self, name: str) -> float | int | None:
        if name not in self.constants:
            return None
        value = numpy_helper.to_array(self.constants[name])
        return value.reshape(()).item() if value.size == 1 else None


def _float_source(qgraph: Graph, fgraph: Graph, name: str) -> str | None:
    """The float tensor a quantized model's tensor stands for, walking back through DequantizeLinear and
    QuantizeLinear (a DequantizeLinear output that kept a float tensor's name, as a renamed graph output does,
    stands for it); ``None`` for a constant (a dequantized weight or bias)."""
    for _ in range(8):
        if name in fgraph.constants:
            return None
        node = qgraph.producer.get(name)
        if node is None or node.op_type not in ("DequantizeLinear", "QuantizeLinear"):
            return None if name in qgraph.constants else name
        if node.op_type == "DequantizeLinear" and name in fgraph.tensors:
            return name
        name = node.input[0]
    return name


def _quantized_where(qgraph: Graph, name: str) -> str | None:
    """For a float tensor that a fused kernel holds quantized (QLinearConv's ``conv_1``): the float tensor
    quantized where its value goes, through ops the quantizer folds (``conv_1`` → Relu → ``relu_1``)."""
    for _ in range(4):
        consumers = qgraph.consumers.get(name, [])
        if len(consumers) != 1:
            return None
        node = consumers[0]
        if node.op_type == "QuantizeLinear":
            return name
        if node.op_type not in _FOLDED:
            return None
        name = node.output[0]
    return None


def _output_params(graph: Graph, name: str) -> tuple[float, int] | None:
    """Scale and zero point of an integer tensor of ORT's graph: its DequantizeLinear consumer's, or its
    producer's output parameters (through ops that only move values)."""
    for _ in range(8):
        for node in graph.consumers.get(name, []):
            if node.op_type == "DequantizeLinear" and node.input[0] == name:
                scale = graph.scalar(node.input[1])
                zero = graph.scalar(node.input[2]) if len(node.input) > 2 and node.input[2] else 0
                return (scale, zero) if scale is not None and zero is not None else None
        node = graph.producer.get(name)
        if node is None:
            return None
        if node.op_type in _OUTPUT_PARAMS:
            s, z = _OUTPUT_PARAMS[node.op_type]
            scale = graph.scalar(node.input[s]) if len(node.input) > s else None
            zero = graph.scalar(node.input[z]) if len(node.input) > z and node.input[z] else 0
            return (scale, zero) if scale is not None and zero is not None else None
        if node.op_type not in _PASS_THROUGH:
            return None
        name = node.input[0]
    return None


@dataclass
class Match:
    float_column: int
    quantized_column: int
    tensor: str
    observed: str
    params: tuple[float, int] | None  # dequantize with these
    how: str = "float"
    layout: tuple[int, ...] = ()  # ORT holds the observed tensor as numpy.transpose(float tensor, layout)

    @property
    def described(self) -> str:
        """How the observed tensor is read: ``float``, ``dequantized, NHWC``…"""
        return self.how + (f", {describe(self.layout)}" if self.layout else "")

    def value(self, array: np.ndarray, reference_shape: tuple[int, ...]) -> np.ndarray | None:
        """The observed tensor as a value of its float twin (dequantized, in its axis order); ``None`` when its
        shape is then not the twin's."""
        if self.params is not None:  # as DequantizeLinear computes it: float32 (x - zero point) * scale
            scale, zero = self.params
            array = (array.astype(np.int32) - np.int32(zero)).astype(np.float32) * np.float32(scale)
        if self.layout and array.ndim != len(self.layout):
            return None
        array = to_original(array, self.layout)
        return array if array.shape == tuple(reference_shape) else None


def _named_start(origin: Any, qgraph: Graph, integer: bool) -> str | None:
    """The quantized model's tensor an observed tensor holds: its mapped original, its own name, or — for the
    integer output of a fused kernel that ORT renamed — the output of the last non-Q/DQ node it computes."""
    if origin.original:
        return origin.original
    if origin.name in qgraph.tensors:
        return origin.name
    if integer:
        for node_name in (*reversed(origin.covers), origin.node):  # a fused kernel may keep its node's name
            node = qgraph.by_name.get(node_name)
            if node is not None and node.op_type not in ("QuantizeLinear", "DequantizeLinear") and node.output:
                return node.output[0]
    return None


def _folded_forward(fgraph: Graph, qgraph: Graph, tensor: str) -> str:
    """The float tensor a quantized value really holds when the quantizer folded the activation after it (a
    QOperator QLinearConv's output is the quantized Relu output): forward through a sole Relu or Clip that the
    quantized model no longer computes."""
    for _ in range(4):
        consumers = fgraph.consumers.get(tensor, [])
        if len(consumers) != 1 or consumers[0].op_type not in _FOLDED:
            return tensor
        after = consumers[0].output[0]
        if after in qgraph.tensors or after + _QOPERATOR_SUFFIX in qgraph.tensors:
            return tensor
        tensor = after
    return tensor


# preference when several observed tensors stand for one float tensor: the tensor a subgraph reads (an outer
# tensor of an If/Loop/Scan, by name: what the branch computes with), the DequantizeLinear output ORT computes,
# then an integer tensor dequantized here, then a float computed before quantization
_PREFERENCE = {"read by a subgraph": -1, "DequantizeLinear output": 0, "dequantized": 1, "float": 2}


def _subgraph_reads(model: onnx.ModelProto) -> set[str]:
    """The outer tensors the subgraphs of a model's nodes read."""
    return {name for node in model.graph.node for name in implicit_inputs(node)}


def match_tensors(float_plan: DumpPlan, quantized_plan: DumpPlan, quantized_model: onnx.ModelProto,
                  quantized_optimized: onnx.ModelProto, float_model: onnx.ModelProto) -> tuple[list[Match], int, list[str]]:
    """The observed quantized tensors matched to observed float tensors (one per float tensor, by
    ``_PREFERENCE``); the number of constants left out; the labels of observed tensors with no float twin or whose
    layout against it cannot be established."""
    qgraph, optimized, fgraph = Graph(quantized_model), Graph(quantized_optimized), Graph(float_model)
    float_columns = {t.original: i for i, t in enumerate(float_plan.tensors) if t.original and t.how in ("same", "relayout")}
    float_columns.update({i.name: -1 for i in float_model.graph.input if i.name not in fgraph.constants})  # the sample itself
    found: dict[str, Match] = {}
    constants, internal = 0, []
    # an outer tensor both models' subgraphs read by the same name: the quantized branch computes with that tensor
    # whatever the quantizer made of it (it removed a Relu and gave the Conv's output the Relu's name: the branch
    # reads the unrectified value), so that is the twin shown, not a DequantizeLinear the branch never reads
    read_by_subgraphs = _subgraph_reads(quantized_model) & _subgraph_reads(float_model)
    for column, (origin, dtype) in enumerate(zip(quantized_plan.tensors, quantized_plan.dtypes)):
        integer = np.dtype(dtype).kind in "iu"
        if (origin.name in read_by_subgraphs and origin.original == origin.name and not integer
                and origin.name in float_columns and origin.how == "same"):
            found[origin.name] = Match(float_columns[origin.name], column, origin.name, origin.name, None, "read by a subgraph")
            continue
        start = _named_start(origin, qgraph, integer)
        if start is None:
            internal.append(origin.label)
            continue
        if integer and start.endswith(_QOPERATOR_SUFFIX) and start[:-len(_QOPERATOR_SUFFIX)] in fgraph.tensors:
            tensor = start[:-len(_QOPERATOR_SUFFIX)]  # a QOperator model's integer tensor: <float name>_quantized
        else:
            if integer and qgraph.op(start) != "QuantizeLinear" and start not in qgraph.constants:
                start = _quantized_where(qgraph, start) or ""
            tensor = _float_source(qgraph, fgraph, start) if start else ""
        if tensor is None:
            constants += 1
            continue
        tensor = _folded_forward(fgraph, qgraph, tensor)
        if tensor not in float_columns:
            internal.append(origin.label)
            continue
        if integer:
            params = _output_params(optimized, origin.name)
            if params is None:
                internal.append(origin.label)
                continue
            how = "dequantized"
        elif qgraph.op(start) == "DequantizeLinear":
            params, how = None, "DequantizeLinear output"
        elif qgraph.op(start) == fgraph.op(tensor):
            params, how = None, "float"
        else:  # the float value before quantization of a tensor whose activation the quantizer folded away
            internal.append(origin.label)
            continue
        # the quantized model's tensor standing for the float one (QDQ keeps the float names; QOperator renames)
        standing = tensor if tensor in qgraph.tensors else start
        layout = quantized_plan.layouts.permutation(origin.name, standing) if quantized_plan.layouts else ()
        if layout is None:
            internal.append(f"{origin.label} (layout unknown)")
            continue
        match = Match(float_columns[tensor], column, tensor, origin.name, params, how, layout)
        if tensor not in found or _PREFERENCE[how] < _PREFERENCE[found[tensor].how]:
            found[tensor] = match
    return sorted(found.values(), key=lambda m: m.float_column), constants, internal




@dataclass
class WeightTwin:
    """A constant the quantized model dequantizes (a weight or a bias) and the float model's initializer."""

    tensor: str  # the float model's initializer
    stored: str  # the quantized model's integer initializer
    consumer: str  # the float model's node that reads it
    op_type: str
    float_value: np.ndarray
    dequantized: np.ndarray  # as DequantizeLinear computes it (per tensor, or per channel along ``axis``)
    per_channel: bool


def _dequantize(node: onnx.NodeProto, graph: Graph) -> tuple[np.ndarray, bool] | None:
    """DequantizeLinear of a constant, as the operator defines it: float32 ``(x - zero point) * scale``, the
    scale and zero point broadcast along ``axis`` (default 1) when they are 1-D."""
    names = list(node.input) + [""] * (3 - len(node.input))
    if names[1] not in graph.constants or (names[2] and names[2] not in graph.constants):
        return None
    x = numpy_helper.to_array(graph.constants[names[0]])
    scale = numpy_helper.to_array(graph.constants[names[1]]).astype(np.float32)
    zero = numpy_helper.to_array(graph.constants[names[2]]) if names[2] else np.zeros_like(scale, dtype=np.int32)
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    per_channel = scale.ndim == 1 and scale.size > 1
    if per_channel:
        shape = [1] * x.ndim
        shape[axis % x.ndim] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return (x.astype(np.int64) - zero.astype(np.int64)).astype(np.float32) * scale, per_channel


def match_weights(quantized_model: onnx.ModelProto, float_model: onnx.ModelProto) -> list[WeightTwin]:
    """Every constant a DequantizeLinear of the quantized model reads, dequantized, beside the float model's
    initializer it stands for (named as the DequantizeLinear output, or as the integer initializer without the
    quantizer's ``_quantized`` suffix), in the float graph's order."""
    qgraph, fgraph = Graph(quantized_model), Graph(float_model)
    labels = {id(node): node_label(node, i) for i, node in enumerate(float_model.graph.node)}
    order = {label: i for i, label in enumerate(labels.values())}
    twins = []
    for node in quantized_model.graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in qgraph.constants:
            continue
        stored = node.input[0]
        candidates = [node.output[0], stored[: -len(_QOPERATOR_SUFFIX)] if stored.endswith(_QOPERATOR_SUFFIX) else ""]
        tensor = next((c for c in candidates if c and c in fgraph.constants), None)
        dequantized = _dequantize(node, qgraph)
        if tensor is None or dequantized is None:
            continue
        value = numpy_helper.to_array(fgraph.constants[tensor])
        if value.shape != dequantized[0].shape:
            continue
        consumer = next(iter(fgraph.consumers.get(tensor, [])), None)
        twins.append(WeightTwin(tensor, stored, labels[id(consumer)] if consumer else "", consumer.op_type if consumer else "",
                                value, dequantized[0], dequantized[1]))
    return sorted(twins, key=lambda t: order.get(t.consumer, len(order)))
