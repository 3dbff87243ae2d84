"""An independent check of a diff's origins and spans on raw tensors (numpy, the model's own graph; nothing of
qconsist's origin rule): for every origin, every tensor its node reads (inputs, and the outer tensors its
subgraphs read) was recorded in both runs and is bit-identical in every sample where it is called an origin,
constants are equal by value, and its output differs there; for every span, its boundary tensors are recorded in
both runs and identical, every tensor its nodes read is computed inside it or lies on the boundary, and its
output differs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper


def raw_tensors(run_dir: Path) -> dict[str, list[np.ndarray]]:
    """Per original tensor, its raw array in every sample (as the dump recorded it: in the original's axis order)."""
    index = json.loads((run_dir / "dump" / "index.json").read_text())["tensors"]
    found: dict[str, list[np.ndarray]] = {}
    for path in sorted((run_dir / "dump" / "raw").glob("*.npz")):
        with np.load(path) as npz:
            seen = set()
            for column, tensor in enumerate(index):
                key = tensor["original"]
                if key and key not in seen and f"t{column}" in npz:
                    seen.add(key)
                    found.setdefault(key, []).append(npz[f"t{column}"])
    return found


def _reads(node: onnx.NodeProto) -> list[str]:
    names = [i for i in node.input if i]
    for attr in node.attribute:
        for graph in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            inner = {v.name for v in graph.input} | {i.name for i in graph.initializer}
            for sub in graph.node:
                names += [i for i in _reads(sub) if i not in inner]
                inner.update(sub.output)
    return list(dict.fromkeys(names))


def _same(x: np.ndarray, y: np.ndarray) -> bool:
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def check_findings(result, run_a: Path, run_b: Path, model_a: onnx.ModelProto, model_b: onnx.ModelProto | None = None) -> dict[str, int]:
    """Assert the property for every origin and span of ``result`` (a DiffResult of two runs with every raw
    tensor kept, compared through ``model_a``'s tensors); how many of each were checked."""
    model_b = model_b or model_a
    a, b = raw_tensors(run_a), raw_tensors(run_b)
    graph = model_a.graph
    producer = {o: n for n in graph.node for o in n.output if o}
    names = {id(n): n.name or f"{n.op_type}_{i}" for i, n in enumerate(graph.node)}
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    constants_b = {i.name: numpy_helper.to_array(i) for i in model_b.graph.initializer}
    constants.update({n.output[0]: None for n in graph.node if n.op_type == "Constant"})
    graph_inputs = {i.name for i in graph.input} - set(constants)
    checked = {"origin": 0, "span": 0}

    def identical(tensor: str, samples: list[int]) -> None:
        assert tensor in a and tensor in b, f"{tensor} was not recorded in both runs"
        for s in samples:
            assert _same(a[tensor][s], b[tensor][s]), f"{tensor} differs in sample {s}"

    for node in result.tensors.nodes:
        if not node.finding:
            continue
        samples = node.origin_samples
        assert samples
        for s in samples:
            assert not _same(a[node.key][s], b[node.key][s]), f"{node.label}: its output agrees in sample {s}"
        if node.finding == "origin":
            made_by = producer[node.key]
            for tensor in _reads(made_by):
                if tensor in constants:
                    if constants[tensor] is not None and tensor not in node.initializers_changed:
                        assert np.array_equal(constants[tensor], constants_b[tensor]), tensor
                elif tensor not in graph_inputs:
                    identical(tensor, samples)
        else:
            inside = {producer[node.key].name} | {n for n in node.span}
            nodes = [n for n in graph.node if names[id(n)] in inside]
            assert producer[node.key] in nodes and len(nodes) == len(node.span)
            made = {o for n in nodes for o in n.output}
            for tensor in node.inputs:
                identical(tensor, samples)
            for n in nodes:
                for tensor in _reads(n):
                    assert tensor in made or tensor in node.inputs or tensor in graph_inputs or tensor in constants, (
                        f"span {node.label}: {tensor} read by {n.name} is neither inside it nor on its boundary")
            assert not set(node.unobserved) & (set(a) & set(b)), f"span {node.label}: an unobserved tensor was recorded"
        checked[node.finding] += 1
    return checked
