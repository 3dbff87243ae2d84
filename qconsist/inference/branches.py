"""What ``If`` branches compute, made observable: the dump's exposure of subgraph tensors, and the flattened graph
the origin rule walks through them.

A tensor computed inside an ``If`` branch cannot be a graph output of the main graph. The dump therefore gives the
``If`` node of its exposed graph one more output per tensor computed in either branch (``expose_branches``): the
branch that computes the tensor returns a copy of it (an ``Identity`` inside the branch), the other branch an
empty tensor of the same element type, which marks "not computed"; one more output, ``<If>/then_taken`` (bool),
is ``true`` from the then branch and ``false`` from the else branch, so the record says which branch ran in each
sample. The values recorded are those of the branch that actually ran (no recomputation); the final outputs stay
checked bit for bit against production like any dump.

Names are paths: the tensor ``t`` of the then branch of the ``If`` node ``gate`` is recorded as ``gate/then/t``
(a branch may reuse an outer name; the path never does), a node inside it as ``gate/then/<node>``; a nested ``If``
``inner`` of that branch gives ``gate/then/inner/else/u`` and the marker ``gate/then/inner/then_taken``. Each
recorded tensor lists the branches that must have run for it to be computed (``TensorOrigin.branch``, outer to
inner, each ``<If path>/then`` or ``<If path>/else``).

``Loop`` and ``Scan`` bodies run once per iteration: their per-iteration values are not exposed, the body stays
opaque, and the dump records a note saying so (``left_out``).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Iterator

import onnx
from onnx import helper

from qconsist.inference.graphmap import node_names, node_reads, op_name, topological_order

log = logging.getLogger(__name__)

MARKER = "then_taken"  # ``<If path>/then_taken``: true where the then branch ran, false where the else branch did
BRANCHES = ("then", "else")
_RECORDABLE = {
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
    onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16,
    onnx.TensorProto.INT32, onnx.TensorProto.UINT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT64,
    onnx.TensorProto.BOOL,
}
_OPAQUE = {"Loop": "body", "Scan": "body"}


@dataclass(frozen=True)
class BranchTensor:
    """One tensor computed inside an ``If`` branch (or a branch marker), as the main graph of the exposed model holds it."""

    name: str  # its path: <If>/<then|else>/<tensor> (a marker: <If>/then_taken)
    node: str  # the path of the node computing it (a marker: its If)
    op_type: str
    branch: tuple[str, ...]  # the branches that must run for it to be computed, outer to inner: "<If path>/<then|else>"


def marker(branch: str) -> tuple[str, bool]:
    """The marker tensor of a branch path ``<If path>/<then|else>`` and the value it holds where that branch ran."""
    path, which = branch.rsplit("/", 1)
    return f"{path}/{MARKER}", which == "then"


def expose_branches(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[BranchTensor], dict[str, str]]:
    """``model`` (its main graph's tensors already exposed) with every tensor computed inside its ``If`` branches,
    nested ones included, exposed as well (module docstring); the tensors exposed, in the order of the new graph
    outputs, and notes on what could not be (``{path: why}``: a tensor of unknown or unrecordable type, a
    ``Loop``/``Scan`` body). ``model`` itself is not changed."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    if not any(_subgraphs(node) for node in exposed.graph.node):
        return exposed, [], {}
    inferred = _inferred(model).graph
    notes: dict[str, str] = {}
    counter = itertools.count()
    found = _expose(exposed.graph, inferred, "", (), notes, counter, main=True)
    present = {o.name for o in exposed.graph.output}
    tensors = []
    for local, elem, tensor in found:
        if local not in present:
            exposed.graph.output.append(helper.make_tensor_value_info(local, elem, None))
            present.add(local)
            tensors.append(tensor)
    return exposed, tensors, notes


# onnxruntime's own operators in its optimized graphs (fusions), whose first output has their first input's element
# type: onnx's shape inference knows no schema for them, so it stops there; the types are carried across them here
_SAME_TYPE = {
    "com.microsoft": {"FusedConv", "FusedGemm", "FusedMatMul", "NhwcConv", "NhwcMaxPool", "QLinearConv", "BiasGelu", "Gelu", "FastGelu",
                      "QuickGelu", "BiasAdd", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                      "SkipSimplifiedLayerNormalization", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu",
                      "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearSoftmax"},
    "com.microsoft.nchwc": None,  # every operator of the NCHWc domain (float in, float out)
}


def _inferred(model: onnx.ModelProto, rounds: int = 8) -> onnx.ModelProto:
    """``model`` with the element types onnx's shape inference establishes, inside subgraphs too, carried across
    onnxruntime's fused operators (``_SAME_TYPE``): inference, then the outputs of those operators whose input type
    is known declared, then inference again, until nothing is added."""
    hinted = onnx.ModelProto()
    hinted.CopyFrom(model)
    inferred = hinted
    for _ in range(rounds):
        try:
            inferred = onnx.shape_inference.infer_shapes(hinted, strict_mode=False)
        except Exception:  # noqa: BLE001 - inference is a help (element types); a failure leaves what is declared
            return inferred
        if not _declare_fused(hinted.graph, inferred.graph):
            return inferred
    return inferred


def _declare_fused(graph: onnx.GraphProto, inferred: onnx.GraphProto) -> bool:
    """Declare in ``graph`` (and its subgraphs) the output types of the fused operators whose first input's type
    ``inferred`` (the same graph, inferred) knows and whose output's it does not; whether any was added."""
    types = _types(inferred)
    added = False
    for index, node in enumerate(graph.node):
        ops = _SAME_TYPE.get(node.domain, set())
        if (ops is None or node.op_type in ops) and node.domain in _SAME_TYPE and node.input and node.output and node.output[0]:
            elem = types.get(node.input[0])
            if elem and node.output[0] not in types:
                graph.value_info.append(helper.make_tensor_value_info(node.output[0], elem, None))
                added = True
        if index < len(inferred.node):
            inner = {a.name: a.g for a in inferred.node[index].attribute if a.type == onnx.AttributeProto.GRAPH}
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH and attribute.name in inner:
                    added |= _declare_fused(attribute.g, inner[attribute.name])
    return added


def _subgraphs(node: onnx.NodeProto) -> list[tuple[str, onnx.GraphProto]]:
    return [(a.name, a.g) for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]


def _types(graph: onnx.GraphProto) -> dict[str, int]:
    """Element types the graph declares (inputs, outputs, value_info), sequences and maps left out."""
    found = {}
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            found[value.name] = value.type.tensor_type.elem_type
    for init in graph.initializer:
        found[init.name] = init.data_type
    return found


def _expose(graph: onnx.GraphProto, inferred: onnx.GraphProto, prefix: str, within: tuple[str, ...],
            notes: dict[str, str], counter: Iterator[int], main: bool = False) -> list[tuple[str, int, BranchTensor]]:
    """Expose the branches of every ``If`` of ``graph`` (a branch at ``prefix``, inside the branches ``within``);
    returns the tensors the graph's scope holds that its parent must expose: (name in this scope, element type, the
    tensor's record). The main graph returns only the ``If`` nodes' new outputs (``expose_all`` made the rest
    outputs already)."""
    types = {**_types(graph), **_types(inferred)}
    names = node_names(graph)
    same = len(inferred.node) == len(graph.node)
    found: list[tuple[str, int, BranchTensor]] = []
    for index, node in enumerate(graph.node):
        label = names[index]
        outputs = [o for o in node.output if o]  # before the If's new outputs
        if node.op_type in _OPAQUE and node.domain in ("", "ai.onnx"):
            notes[f"{prefix}{label}/{_OPAQUE[node.op_type]}"] = (
                f"a {node.op_type} body runs once per iteration: its tensors are not observed (the {node.op_type} is "
                "one opaque node)")
        if node.op_type == "If" and node.domain in ("", "ai.onnx"):
            inner = {a.name: a.g for a in (inferred.node[index].attribute if same else node.attribute)
                     if a.type == onnx.AttributeProto.GRAPH}
            taken = {o for n in graph.node for o in n.output} | {v.name for v in [*graph.input, *graph.initializer]}
            found += _wire(node, label, inner, (prefix, within, taken), notes, counter)
        if main:
            continue
        for out in outputs:
            elem = types.get(out)
            path = f"{prefix}{out}"
            if elem not in _RECORDABLE:
                notes[path] = ("inside an If branch, of an element type not established (onnx shape inference)"
                               if elem is None else f"inside an If branch, of element type {elem}: not recorded")
                continue
            found.append((out, elem, BranchTensor(path, f"{prefix}{label}", op_name(node), within)))
    return found


def _wire(node: onnx.NodeProto, label: str, inferred: dict[str, onnx.GraphProto], scope: tuple[str, tuple[str, ...], set[str]],
          notes: dict[str, str], counter: Iterator[int]) -> list[tuple[str, int, BranchTensor]]:
    """Give the ``If`` ``node`` one output per tensor its branches compute (the branch computing it returns its copy,
    the other one an empty tensor of its element type) and the marker output; returns them as its scope names them.
    ``scope``: where the node lies (its path prefix, the branches it lies in, the names its graph already uses: a
    path one of them holds is not exposed, noted)."""
    prefix, within, used = scope
    branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    if set(branches) != {"then_branch", "else_branch"}:
        return []
    if f"{label}/{MARKER}" in used:
        notes[f"{prefix}{label}/{MARKER}"] = "its path is a tensor name the graph already uses: the If's branches are not observed"
        return []
    exposed: dict[str, list[tuple[str, int, BranchTensor]]] = {}
    for which in BRANCHES:
        key = f"{which}_branch"
        graph = branches[key]
        exposed[which] = _expose(graph, inferred.get(key, graph), f"{prefix}{label}/{which}/", (*within, f"{prefix}{label}/{which}"),
                                 notes, counter)
    found: list[tuple[str, int, BranchTensor]] = []
    for which in BRANCHES:
        own, other = branches[f"{which}_branch"], branches[f"{'else' if which == 'then' else 'then'}_branch"]
        for local, elem, tensor in exposed[which]:
            if f"{label}/{which}/{local}" in used:
                notes[tensor.name] = "its path is a tensor name the graph already uses: not observed"
                continue
            copy, empty = f"__qconsist_branch_{next(counter)}", f"__qconsist_branch_{next(counter)}"
            own.node.append(helper.make_node("Identity", [local], [copy], name=copy))
            own.output.append(helper.make_tensor_value_info(copy, elem, None))
            other.node.append(helper.make_node("Constant", [], [empty], name=empty,
                                               value=helper.make_tensor(empty, elem, [0], [])))
            other.output.append(helper.make_tensor_value_info(empty, elem, None))
            name = f"{label}/{which}/{local}"
            node.output.append(name)
            found.append((name, elem, tensor))
    taken = f"__qconsist_branch_{next(counter)}"
    for which in BRANCHES:
        graph = branches[f"{which}_branch"]
        graph.node.append(helper.make_node("Constant", [], [f"{taken}_{which}"], name=f"{taken}_{which}",
                                           value=helper.make_tensor(f"{taken}_{which}", onnx.TensorProto.BOOL, [], [which == "then"])))
        graph.output.append(helper.make_tensor_value_info(f"{taken}_{which}", onnx.TensorProto.BOOL, None))
    node.output.append(f"{label}/{MARKER}")
    found.append((f"{label}/{MARKER}", onnx.TensorProto.BOOL, BranchTensor(f"{prefix}{label}/{MARKER}", f"{prefix}{label}", "If", within)))
    return found


@dataclass(frozen=True)
class FlatNode:
    """A node of a graph flattened through its ``If`` branches, every tensor under its path (``flatten``)."""

    name: str  # its path: <If>/<then|else>/<node> inside a branch
    op_type: str
    reads: tuple[str, ...]  # every tensor it reads, by path (an If: its condition, the outer tensors its branches
    # read and its branches' outputs; a node inside a branch: also the condition of every If it lies in)
    outputs: tuple[str, ...]  # by path (an If: also its marker <If>/then_taken)


@dataclass
class Flattened:
    """A graph flattened through its ``If`` branches: nodes in an order where each comes after what it reads (a
    branch's nodes just before their ``If``), and the constants (initializers, ``Constant`` outputs) by path."""

    nodes: list[FlatNode]
    constants: dict[str, onnx.TensorProto]


def flatten(graph: onnx.GraphProto) -> Flattened:
    """``graph`` with the nodes of its ``If`` branches (nested ones too) under their paths, as the dump names them
    (``expose_branches``); ``Loop``/``Scan`` bodies stay inside their node, read through its implicit inputs."""
    found = Flattened([], {})
    _flatten(graph, "", [], (), found)
    return found


def _flatten(graph: onnx.GraphProto, prefix: str, scopes: list[dict[str, str]], conditions: tuple[str, ...],
             found: Flattened) -> dict[str, str]:
    """Append ``graph``'s nodes (a branch at ``prefix`` inside the branches whose conditions are ``conditions``) to
    ``found``; returns the scope: each local tensor's path."""
    local: dict[str, str] = {}
    for init in graph.initializer:
        local[init.name] = f"{prefix}{init.name}"
        found.constants[local[init.name]] = init
    for node in graph.node:
        local.update({o: f"{prefix}{o}" for o in node.output if o})
    chain = [*scopes, local]

    def resolve(name: str) -> str:
        return next((scope[name] for scope in reversed(chain) if name in scope), name)

    names = node_names(graph)
    for index in topological_order(graph):
        node, label = graph.node[index], f"{prefix}{names[index]}"
        outputs = tuple(resolve(o) for o in node.output if o)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            value = next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)
            if value is not None and outputs:
                found.constants[outputs[0]] = value
            found.nodes.append(FlatNode(label, op_name(node), (), outputs))
            continue
        reads = [resolve(r) for r in node_reads(node)]
        branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
        if node.op_type == "If" and node.domain in ("", "ai.onnx") and set(branches) == {"then_branch", "else_branch"}:
            condition = resolve(node.input[0])
            for which in BRANCHES:
                branch = branches[f"{which}_branch"]
                scope = _flatten(branch, f"{label}/{which}/", chain, (*conditions, condition), found)
                reads += [scope.get(o.name, resolve(o.name)) for o in branch.output]
            outputs += (f"{label}/{MARKER}",)
        reads += [c for c in conditions if c not in reads]
        found.nodes.append(FlatNode(label, op_name(node), tuple(dict.fromkeys(r for r in reads if r)), outputs))
    return local

