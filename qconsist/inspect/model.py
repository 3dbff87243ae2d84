"""An ONNX model at a glance: inputs and outputs, opsets, ops by count, weights, and how much of it is quantized.

**Quantized share.** A node *runs quantized* when it is an integer kernel (``QLinear*``, ``QGemm``,
``ConvInteger``, ``MatMulInteger``, ``DynamicQuantize*``) or, in a QDQ model, when every activation it reads
comes from a DequantizeLinear and everything it writes goes only to QuantizeLinear nodes — the pattern ONNX
Runtime fuses into an integer kernel. The share is over the nodes that compute (QuantizeLinear and
DequantizeLinear themselves not counted); weights are quantized when they are stored as integers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qconsist.errors import InputError, RunStoreError
from qconsist.inference.graphmap import node_reads
from qconsist.onnxfile import read_onnx
from qconsist.store.hashing import hash_file
from qconsist.store.serde import serialized

SCHEMA = "qconsist.inspect.model/1"
_QDQ = {"QuantizeLinear", "DequantizeLinear"}
_INTEGER_KERNELS = {"ConvInteger", "MatMulInteger", "QGemm", "DynamicQuantizeLinear", "DynamicQuantizeMatMul"}


@dataclass
class ValueSpec:
    name: str
    dtype: str
    shape: list[Any]  # ints, symbolic names, or null for an unknown dimension


@serialized(
    schema=SCHEMA, derived=("quantized_share",), error=RunStoreError,
    refused="model summary schema {found!r} is not {schema!r}", malformed="model summary is malformed: {exc}",
)
@dataclass
class ModelSummary:
    """What an ONNX model holds."""

    path: str
    md5: str
    sha256: str
    size: int
    ir_version: int
    opsets: dict[str, int]  # domain ("" is onnx) -> version
    producer: str
    inputs: list[ValueSpec]
    outputs: list[ValueSpec]
    nodes: int
    ops: dict[str, int]  # op ("domain:op" outside onnx) -> count, most frequent first
    initializers: int
    parameters: int  # elements of every initializer
    initializer_bytes: int
    format: str  # "QDQ" | "QOperator" | "float"
    quantized_nodes: int  # computing nodes that run quantized (see the module docstring)
    computing_nodes: int  # nodes other than QuantizeLinear / DequantizeLinear
    integer_weight_bytes: int  # initializer bytes stored as 8- or 16-bit integers
    not_quantized: list[str] = field(default_factory=list)  # ops of the computing nodes left in float, by count

    @property
    def quantized_share(self) -> float:
        return self.quantized_nodes / self.computing_nodes if self.computing_nodes else 0.0


def _op(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"


def _spec(value: onnx.ValueInfoProto) -> ValueSpec:
    tensor = value.type.tensor_type
    try:
        dtype = str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)))
    except (KeyError, TypeError, ValueError):
        dtype = onnx.TensorProto.DataType.Name(tensor.elem_type) if tensor.elem_type else "unknown"
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
    return ValueSpec(value.name, dtype, dims)


def _quantized(graph: onnx.GraphProto, constants: set[str]) -> tuple[int, int, Counter]:
    producer = {out: node for node in graph.node for out in node.output if out}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node_reads(node):  # with the outer tensors its subgraphs read
            consumers.setdefault(name, []).append(node)
    quantized, computing, floating = 0, 0, Counter()
    for node in graph.node:
        if node.op_type in _QDQ or node.op_type == "Constant":
            continue
        computing += 1
        if node.op_type.startswith("QLinear") or node.op_type in _INTEGER_KERNELS:
            quantized += 1
            continue
        activations = [i for i in node_reads(node) if i not in constants]
        outputs = [o for o in node.output if o]
        reads = bool(activations) and all(getattr(producer.get(i), "op_type", None) == "DequantizeLinear" for i in activations)
        writes = bool(outputs) and all(consumers.get(o) and all(c.op_type == "QuantizeLinear" for c in consumers[o]) for o in outputs)
        if reads and writes:
            quantized += 1
        else:
            floating[_op(node)] += 1
    return quantized, computing, floating


def summarize_model(path: Path | str) -> ModelSummary:
    """The summary of the ONNX model at ``path``; ``InputError`` for a file that is not one."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"model {path} does not exist")
    model = read_onnx(path)
    graph = model.graph
    hashes = hash_file(path)
    constants = {i.name for i in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    ops = Counter(_op(n) for n in graph.node)
    parameters = sum(int(np.prod(i.dims)) if i.dims else 1 for i in graph.initializer)
    sizes = [(i.data_type, int(np.prod(i.dims)) if i.dims else 1) for i in graph.initializer]
    nbytes = [count * onnx.helper.tensor_dtype_to_np_dtype(t).itemsize if t else 0 for t, count in sizes]
    integer = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16,
               onnx.TensorProto.INT4, onnx.TensorProto.UINT4}
    quantized, computing, floating = _quantized(graph, constants)
    if any(n.op_type.startswith("QLinear") or n.op_type in _INTEGER_KERNELS for n in graph.node):
        fmt = "QOperator"
    elif ops.get("DequantizeLinear"):
        fmt = "QDQ"
    else:
        fmt = "float"
    return ModelSummary(
        path=str(path), md5=hashes.md5, sha256=hashes.sha256, size=path.stat().st_size,
        ir_version=model.ir_version, opsets={o.domain: o.version for o in model.opset_import},
        producer=" ".join(p for p in (model.producer_name, model.producer_version) if p),
        inputs=[_spec(v) for v in graph.input if v.name not in constants], outputs=[_spec(v) for v in graph.output],
        nodes=len(graph.node), ops=dict(ops.most_common()), initializers=len(graph.initializer), parameters=parameters,
        initializer_bytes=sum(nbytes), format=fmt, quantized_nodes=quantized, computing_nodes=computing,
        integer_weight_bytes=sum(b for (t, _), b in zip(sizes, nbytes) if t in integer),
        not_quantized=[f"{op} ×{count}" for op, count in floating.most_common()],
    )
