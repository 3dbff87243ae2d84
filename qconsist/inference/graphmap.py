"""Map the tensors of ONNX Runtime's optimized graph back to the nodes of the original model.

ORT's optimizer fuses nodes (QDQ groups into QLinearConv, Conv+Relu into FusedConv), changes layouts
(NCHWc, NHWC) and renames tensors. For every tensor of the optimized graph this module finds:

* ``original``: the tensor of the original model holding the same value, when there is one. A surviving
  name with the same element type is that tensor ("same"). A surviving name whose element type changed
  (a QLinearConv output keeps the float Conv output's name but holds its quantized value) is followed
  forward through value-preserving original nodes (QuantizeLinear, DequantizeLinear, Relu, Clip, Cast,
  Identity) to the first tensor of the right element type and rank ("renamed"). Otherwise the tensor is
  ``internal`` to the optimized graph (a fusion's intermediate) and has no original twin.
* ``layout``: the axis order ORT holds it in, from the graph (``layout.py``), never from shapes: the same as
  the original's, or a permutation of it ("relayout": an NHWC QLinearConv, a DequantizeLinear the NHWC
  transformer moved a Transpose through — with C == H == W its shape is the original's), or not established
  ("layout unknown": NCHWc channel blocks, labels that do not match): such a tensor has no original twin and is
  never compared with one.
* ``covers``: the original nodes the optimized node computes: those between the original tensors its
  inputs stand for and the original tensor its output stands for.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import onnx

from qconsist.inference.layout import Layouts
from qconsist.onnxfile import node_label
from qconsist.store.serde import serialized

_VALUE_PRESERVING = {"QuantizeLinear", "DequantizeLinear", "Relu", "Clip", "Cast", "Identity"}
_QDQ = {"QuantizeLinear", "DequantizeLinear"}
_MAX_FOLLOW = 4


@serialized
@dataclass(frozen=True)
class TensorOrigin:
    """One dumped tensor and where it comes from in the original model."""

    name: str  # tensor name in the dumped (optimized) graph
    node: str  # optimized node producing it ("" for a graph input)
    op_type: str  # that node's op, "domain:op" outside the ONNX domain
    original: str | None  # original tensor with the same value, if any
    # "same" | "renamed" | "relayout" (another axis order: ``layout``) | "layout unknown" | "internal" | "branch" (computed
    # inside an If branch: ``branch``)
    how: str
    label: str  # name users know: the original node that computes it
    covers: tuple[str, ...] = field(default=())  # original nodes the optimized node computes
    # with ``original``: ORT holds it as numpy.transpose(original, layout); () the original's own order
    layout: tuple[int, ...] = field(default=())
    # ORT holds it in NCHWc channel blocks (``layout.py``); ``channels`` > 0: recorded in NCHW with that many channels
    # (``layout.unblock``), 0: recorded as ORT holds it (its real channel count not established)
    blocked: bool = False
    channels: int = 0
    # computed inside ``If`` branches (``branches.py``): the branches that must run for it to be computed, outer to
    # inner, each "<If path>/then" or "<If path>/else"; () a tensor of the main graph
    branch: tuple[str, ...] = ()


def op_name(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"


def implicit_inputs(node: onnx.NodeProto) -> list[str]:
    """The outer tensors a node's subgraphs (``If`` branches, ``Loop``/``Scan`` bodies) read: names their nodes
    use that the subgraph neither takes as an input, holds as an initializer nor computes itself."""
    found: dict[str, None] = {}
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else []
        for graph in graphs:
            local = {v.name for v in graph.input} | {i.name for i in graph.initializer}
            local |= {o for inner in graph.node for o in inner.output if o}
            for inner in graph.node:
                for name in [*inner.input, *implicit_inputs(inner)]:
                    if name and name not in local:
                        found[name] = None
    return list(found)


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Every tensor a node reads: its inputs, then the outer tensors its subgraphs read."""
    explicit = [i for i in node.input if i]
    return explicit + [i for i in implicit_inputs(node) if i not in explicit]


def unchanged_tensors(original: onnx.ModelProto, optimized: onnx.ModelProto) -> set[str]:
    """Tensors of ``optimized`` computed exactly as in ``original``: the same node (op, domain, attributes,
    inputs and outputs) makes them, from graph inputs, initializers of the same type and shape, and tensors that
    are themselves unchanged. Such a tensor holds the original's value in the original's layout, whatever the
    labels of ``layout.py`` can establish (at level disable ORT runs the original graph: every tensor)."""
    opsets = {o.domain or "ai.onnx": o.version for o in original.opset_import}
    defaults: dict[tuple[str, str], dict[str, object]] = {}

    def key(node: onnx.NodeProto) -> bytes:
        """The node's bytes with its attributes in name order and those equal to the schema's default left out:
        ORT saves its graph with the defaults written (QuantizeLinear's axis 1) and attributes in its own order."""
        domain = node.domain or "ai.onnx"
        if (node.op_type, domain) not in defaults:
            defaults[(node.op_type, domain)] = _defaults(node.op_type, domain, opsets.get(domain))
        default = defaults[(node.op_type, domain)]
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.ClearField("doc_string")  # "Added by EnsureUniqueDQForNodeUnit"
        del copy.attribute[:]
        copy.attribute.extend(sorted((a for a in node.attribute if not (a.name in default and _value(a) == default[a.name])),
                                     key=lambda a: a.name))
        return copy.SerializeToString(deterministic=True)

    original_nodes = {out: key(node) for node in original.graph.node for out in node.output if out}
    shapes = {i.name: (i.data_type, tuple(i.dims)) for i in original.graph.initializer}
    same_inits = {i.name for i in optimized.graph.initializer if shapes.get(i.name) == (i.data_type, tuple(i.dims))}
    ready = ({v.name for v in original.graph.input} & {v.name for v in optimized.graph.input}) | same_inits
    # a copy of an original node under new names (EnsureUniqueDQForNodeUnit, which runs even at level disable,
    # gives each consumer of a DequantizeLinear its own: '<output>/duplicated') computes the original's value
    def body(node: onnx.NodeProto) -> bytes:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.ClearField("name")
        copy.ClearField("output")
        return key(copy)

    bodies = {body(node): list(node.output) for node in original.graph.node if len(node.output) == 1 and node.output[0]}
    copies: dict[str, str] = {}  # a copy's output -> the original tensor it equals
    unchanged: set[str] = set()
    for node in optimized.graph.node:  # ORT saves its graph in topological order
        outputs = [o for o in node.output if o]
        reads = node_reads(node)
        if any(i in copies for i in node.input):
            node = _reading(node, copies)
        if outputs and all(original_nodes.get(o) == key(node) for o in outputs) and all(i in ready or i in copies for i in reads):
            unchanged.update(outputs)
            ready.update(outputs)
        elif len(outputs) == 1 and outputs[0] not in original_nodes and all(i in ready or i in copies for i in reads):
            twin = bodies.get(body(node))
            if twin:
                copies[outputs[0]] = twin[0]
    return unchanged


def _value(attribute: onnx.AttributeProto) -> object:
    value = onnx.helper.get_attribute_value(attribute)
    return list(value) if isinstance(value, (list, tuple)) else value


def _defaults(op_type: str, domain: str, version: int | None) -> dict[str, object]:
    """The attributes of ``op_type``'s schema that have a default, with it (none for an unknown op)."""
    try:
        schema = onnx.defs.get_schema(op_type, version or onnx.defs.onnx_opset_version(), "" if domain == "ai.onnx" else domain)
    except onnx.defs.SchemaError:  # an op onnx does not know (a contrib op): no defaults left out
        return {}
    return {name: _value(a.default_value) for name, a in schema.attributes.items() if a.default_value.type}


def _reading(node: onnx.NodeProto, copies: dict[str, str]) -> onnx.NodeProto:
    """``node`` reading the original tensors its inputs are copies of."""
    renamed = onnx.NodeProto()
    renamed.CopyFrom(node)
    renamed.ClearField("input")
    renamed.input.extend(copies.get(i, i) for i in node.input)
    return renamed


def node_names(graph: onnx.GraphProto) -> list[str]:
    """Node names, with a stable invented name, marked as such, for unnamed nodes (``onnxfile.node_label``)."""
    return [node_label(node, i) for i, node in enumerate(graph.node)]


@dataclass
class GraphIndex:
    """Producers, consumers, names and known tensor types of one graph."""

    graph: onnx.GraphProto
    names: list[str]
    producer: dict[str, int]
    consumers: dict[str, list[int]]
    initializers: set[str]
    inputs: set[str]
    types: dict[str, tuple[str, tuple | None]]  # tensor -> (numpy dtype name, shape or None)
    ranks: dict[str, int] = field(default_factory=dict)  # tensor -> rank, where shape inference knows it

    @classmethod
    def of(cls, model: onnx.ModelProto, infer: bool = True) -> "GraphIndex":
        graph = model.graph
        if infer:
            try:
                graph = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
            except Exception:  # noqa: BLE001 - inference is a help; contrib ops often defeat it
                graph = model.graph
        producer, consumers = {}, {}
        for i, node in enumerate(graph.node):
            for out in node.output:
                if out:
                    producer[out] = i
            for inp in node_reads(node):
                consumers.setdefault(inp, []).append(i)
        types, ranks = {}, {}
        for value in list(graph.value_info) + list(graph.output) + list(graph.input):
            typed = _value_type(value)
            if typed is not None:
                types[value.name] = typed
            if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
                ranks[value.name] = len(value.type.tensor_type.shape.dim)
        inits = {init.name for init in graph.initializer}
        return cls(graph, node_names(graph), producer, consumers, inits, {v.name for v in graph.input} - inits, types, ranks)

    def activation_inputs(self, node: onnx.NodeProto) -> list[str]:
        """The tensors a node reads that are no initializers: its inputs and its subgraphs' outer tensors."""
        return [i for i in node_reads(node) if i not in self.initializers]


def _value_type(value: onnx.ValueInfoProto) -> tuple[str, tuple | None] | None:
    if not value.type.HasField("tensor_type") or not value.type.tensor_type.elem_type:
        return None
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)).name
    except (KeyError, TypeError, ValueError):
        return None
    shape = None
    if value.type.tensor_type.HasField("shape"):
        dims = value.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shape = tuple(d.dim_value for d in dims)
    return dtype, shape


def _type_fits(original: tuple[str, tuple | None] | None, dtype: str, shape: tuple | None) -> bool:
    """The same element type (and rank, where both are known). Never the same shape: a tensor ORT holds in
    another layout has another shape, or — when C == H == W — the same one; ``layout.py`` decides."""
    if original is None:
        return True
    if original[0] != dtype:
        return False
    return original[1] is None or shape is None or len(original[1]) == len(shape)


def _follow(orig: GraphIndex, start: str, dtype: str, shape: tuple | None) -> str | None:
    """The first original tensor after ``start`` through value-preserving nodes with the given type."""
    queue = deque([(start, 0)])
    while queue:
        tensor, depth = queue.popleft()
        if depth >= _MAX_FOLLOW:
            continue
        for index in orig.consumers.get(tensor, []):
            node = orig.graph.node[index]
            if node.op_type not in _VALUE_PRESERVING or node.input[0] != tensor:
                continue
            for out in node.output:
                if out and out in orig.types and _type_fits(orig.types[out], dtype, shape):
                    return out
                if out:
                    queue.append((out, depth + 1))
    return None


def _covered(orig: GraphIndex, target: str, starts: set[str]) -> list[int]:
    """Original nodes needed to compute ``target`` from ``starts`` (and initializers)."""
    seen: set[int] = set()
    stack = [target]
    visited: set[str] = set()
    while stack:
        tensor = stack.pop()
        if tensor in visited or tensor in starts or tensor in orig.initializers or tensor in orig.inputs:
            continue
        visited.add(tensor)
        index = orig.producer.get(tensor)
        if index is None or index in seen:
            continue
        seen.add(index)
        stack.extend(node_reads(orig.graph.node[index]))
    return sorted(seen)


def _principal(orig: GraphIndex, covered: list[int], target: str | None) -> str | None:
    """The covered node a user would name: the one compute node, else the target's producer."""
    compute = [i for i in covered if orig.graph.node[i].op_type not in _QDQ]
    if len(compute) == 1:
        return orig.names[compute[0]]
    if target is not None and target in orig.producer:
        return orig.names[orig.producer[target]]
    return None


def _surviving(orig: GraphIndex, name: str, by_node_name: dict[str, int]) -> str | None:
    """The original tensor a surviving name points at: the tensor itself, or (ORT names the outputs of
    QDQ fusions after the fused node) the first output of the original node of that name."""
    if name in orig.producer or name in orig.inputs:
        return name
    index = by_node_name.get(name)
    if index is not None and orig.graph.node[index].output:
        return orig.graph.node[index].output[0]
    return None


def map_tensors(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    runtime_types: dict[str, tuple[str, tuple | None]],
    runtime_ranks: dict[str, int] | None = None,
    runtime_dims: dict[str, tuple] | None = None,
) -> tuple[list[TensorOrigin], Layouts]:
    """Where each tensor of ``optimized`` (node outputs, in node order) comes from in ``original``, and the
    layouts of both graphs.

    ``runtime_types`` gives each dumped tensor's element type and shape as onnxruntime reports them, and
    ``runtime_ranks`` their ranks where known (broadcasting ops take the layout of their highest-rank input),
    ``runtime_dims`` their shapes where known (an unknown dimension ``None``: the channel counts of NCHWc blocks).
    """
    orig = GraphIndex.of(original)
    opt = GraphIndex.of(optimized, infer=False)
    by_node_name = {name: i for i, name in enumerate(orig.names)}
    mapped: dict[str, str | None] = {name: name for name in opt.inputs}
    starts: dict[str, set[str]] = {name: {name} for name in opt.inputs}
    found: list[tuple[int, str, str | None, str, str | None, list[int]]] = []
    for index, node in enumerate(optimized.graph.node):
        node_starts: set[str] = set()
        for inp in opt.activation_inputs(node):
            if mapped.get(inp):
                node_starts.add(mapped[inp])  # type: ignore[arg-type]
            else:
                node_starts |= starts.get(inp, set())
        for out in node.output:
            if not out:
                continue
            dtype, shape = runtime_types.get(out, ("", None))
            target, how, anchor = None, "internal", _surviving(orig, out, by_node_name)
            if anchor is not None:
                if anchor == out and _type_fits(orig.types.get(out), dtype, shape):
                    target, how = out, "same"
                else:
                    target = anchor if _type_fits(orig.types.get(anchor), dtype, shape) else _follow(orig, anchor, dtype, shape)
                    how = "renamed" if target else "internal"
                    anchor = target or anchor
            mapped[out] = target
            starts[out] = node_starts if anchor is None else {anchor}
            found.append((index, out, target, how, anchor, _covered(orig, anchor, node_starts) if anchor else []))
    inferred = GraphIndex.of(optimized).ranks  # onnx's shape inference knows a scalar's rank where ORT says []
    layouts = Layouts.of(original, optimized, orig.ranks, {**inferred, **(runtime_ranks or {})}, _dims(orig.graph),
                         runtime_dims)
    unchanged = unchanged_tensors(original, optimized)
    result: list[TensorOrigin] = []
    for index, out, target, how, anchor, covered in found:
        node = optimized.graph.node[index]
        layout: tuple[int, ...] = ()
        if target is not None and target == out and out in unchanged:
            pass  # computed as in the original, from the original's tensors: its layout
        elif target is not None:
            perm = layouts.permutation(out, target)
            if perm is None:
                how, target = "layout unknown", None
            elif perm:
                how, layout = "relayout", perm
        principal = _principal(orig, covered, anchor)
        label = principal or f"{opt.names[index]} ({op_name(node)}, internal to ORT's optimized graph)"
        result.append(TensorOrigin(
            name=out, node=opt.names[index], op_type=op_name(node), original=target, how=how,
            label=label, covers=tuple(orig.names[i] for i in covered), layout=layout,
            blocked=layouts.blocked(out), channels=layouts.channels(out),
        ))
    return result, layouts


def _dims(graph: onnx.GraphProto) -> dict[str, tuple]:
    """Every typed tensor's shape, an unknown dimension ``None``."""
    found = {}
    for value in list(graph.value_info) + list(graph.output) + list(graph.input):
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            found[value.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim)
    return found


def structure_hash(model: onnx.ModelProto) -> str:
    """sha256 of the graph's structure: nodes, attributes, tensor names, initializer types and shapes,
    but not initializer values. Two models with the same structure can be compared tensor by tensor."""
    h = hashlib.sha256()

    def put(*parts: Iterable | str) -> None:
        for part in parts:
            h.update(repr(part).encode())

    graph = model.graph
    put([v.name for v in graph.input], [v.name for v in graph.output])
    for init in graph.initializer:
        put(init.name, init.data_type, list(init.dims))
    for node in graph.node:
        attrs = []
        for attr in node.attribute:
            value = onnx.helper.get_attribute_value(attr)
            if isinstance(value, onnx.TensorProto):
                value = (value.data_type, list(value.dims))
            elif isinstance(value, (onnx.GraphProto,)):
                value = value.SerializeToString(deterministic=True)
            attrs.append((attr.name, value))
        put(node.domain, node.op_type, list(node.input), list(node.output), sorted(attrs, key=lambda a: a[0]))
    return h.hexdigest()


def topological_order(graph: onnx.GraphProto) -> list[int]:
    """Node indices in an order where every node comes after the producers of what it reads (its subgraphs' outer
    tensors included): one depth-first order, used by the dump and the diff alike."""
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    order: list[int] = []
    state: dict[int, int] = {}
    for root in range(len(graph.node)):
        stack = [(root, False)]
        while stack:
            index, done = stack.pop()
            if done:
                if state.get(index) != 2:
                    state[index] = 2
                    order.append(index)
                continue
            if state.get(index):
                continue
            state[index] = 1
            stack.append((index, True))
            for inp in node_reads(graph.node[index]):
                dep = producer.get(inp)
                if dep is not None and not state.get(dep):
                    stack.append((dep, False))
    return order
