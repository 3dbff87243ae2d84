"""What onnxruntime rewrote: the nodes of one optimized graph that another does not have.

Two graphs onnxruntime saved (``optimized_model_filepath``) for the same model are compared node by node: a
node is the same in both when its name, operator (with domain) and input and output tensors are the same.
What only the first graph has, onnxruntime removed or replaced; what only the second has, it produced.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from qconsist.errors import RunStoreError
from qconsist.inference.graphmap import TensorOrigin, node_names, op_name
from qconsist.onnxfile import read_onnx
from qconsist.store.serde import serialized


@serialized
@dataclass(frozen=True)
class NodeRef:
    name: str
    op_type: str  # "domain:op" outside the ONNX domain

    def __str__(self) -> str:
        return f"{self.name} ({self.op_type})"


@serialized(derived=("summary",))
@dataclass
class GraphRewrites:
    """Nodes only ``before`` has (``removed``) and only ``after`` has (``added``), in graph order."""

    before: str  # what the graphs are, in words
    after: str
    nodes_before: int = 0
    nodes_after: int = 0
    removed: list[NodeRef] = field(default_factory=list)
    added: list[NodeRef] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.removed and not self.added

    def summary(self) -> str:
        """``-3 Conv, -6 DequantizeLinear, +3 QLinearConv`` (operators removed and added, by count)."""
        if self.identical:
            return "same nodes"
        removed = Counter(n.op_type for n in self.removed)
        added = Counter(n.op_type for n in self.added)
        parts = [f"-{count} {op}" for op, count in sorted(removed.items(), key=lambda kv: (-kv[1], kv[0]))]
        parts += [f"+{count} {op}" for op, count in sorted(added.items(), key=lambda kv: (-kv[1], kv[0]))]
        return ", ".join(parts)


def _signatures(model: onnx.ModelProto) -> list[tuple[tuple, NodeRef]]:
    names = node_names(model.graph)
    return [((names[i], op_name(node), tuple(node.input), tuple(node.output)), NodeRef(names[i], op_name(node)))
            for i, node in enumerate(model.graph.node)]


def load_graph(path: Path, what: str) -> onnx.ModelProto:
    return read_onnx(path, what=what, error=RunStoreError)


def graph_rewrites(before: onnx.ModelProto, after: onnx.ModelProto, before_label: str, after_label: str) -> GraphRewrites:
    """The nodes that differ between two graphs (see the module docstring)."""
    sig_before, sig_after = _signatures(before), _signatures(after)
    keys_before, keys_after = Counter(k for k, _ in sig_before), Counter(k for k, _ in sig_after)
    removed = [ref for key, ref in sig_before if keys_after[key] < keys_before[key]]
    added = [ref for key, ref in sig_after if keys_before[key] < keys_after[key]]
    return GraphRewrites(before_label, after_label, len(sig_before), len(sig_after), removed, added)


@serialized
@dataclass(frozen=True)
class ProducingNode:
    """The node of an optimized graph that computes a tensor users know, and the original nodes it covers."""

    node: str
    op_type: str
    covers: tuple[str, ...]

    def __str__(self) -> str:
        covered = f" computing {', '.join(self.covers)}" if self.covers else ""
        return f"{self.node} ({self.op_type}){covered}"


def producing_node(tensors: list[TensorOrigin], key: str) -> ProducingNode | None:
    """The node producing the dumped tensor whose name or original tensor is ``key``."""
    for tensor in tensors:
        if key in (tensor.original, tensor.name):
            return ProducingNode(tensor.node, tensor.op_type, tuple(tensor.covers))
    return None


_PLUMBING = {"Transpose", "com.microsoft.nchwc:ReorderInput", "com.microsoft.nchwc:ReorderOutput", "QuantizeLinear",
             "DequantizeLinear", "Reshape", "Identity"}


def nearest_rewritten(graph: onnx.ModelProto, start: str, rewritten: list[NodeRef], tensors: list[TensorOrigin],
                      depth: int = 4) -> list[ProducingNode]:
    """The rewritten nodes within ``depth`` nodes upstream of node ``start`` of ``graph`` (itself included),
    nearest first, with the original nodes each one covers: where the rewrite that changed a tensor computed
    by ``start`` sits. Computing nodes only, when there are any (not layout changes, quantize or dequantize)."""
    names = node_names(graph.graph)
    wanted = {(n.name, n.op_type) for n in rewritten}
    producer = {out: i for i, node in enumerate(graph.graph.node) for out in node.output if out}
    covers = {t.node: tuple(t.covers) for t in tensors}
    frontier = [i for i, name in enumerate(names) if name == start]
    seen, found = set(frontier), []
    for _ in range(depth + 1):
        following = []
        for index in frontier:
            node = graph.graph.node[index]
            if (names[index], op_name(node)) in wanted:
                found.append(ProducingNode(names[index], op_name(node), covers.get(names[index], ())))
            for name in node.input:
                upstream = producer.get(name)
                if upstream is not None and upstream not in seen:
                    seen.add(upstream)
                    following.append(upstream)
        frontier = following
    computing = [n for n in found if n.op_type not in _PLUMBING]
    return computing or found
