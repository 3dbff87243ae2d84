"""The per-node divergence of a diff as node data for Google's Model Explorer (``ai-edge-model-explorer`` with
the ``model-explorer-onnx`` adapter): open the model, load a file as node data, and the nodes are coloured.

Model Explorer's node-data format: ``{graph id: {"results": {node id: {"value": number}}, "thresholds": [...]}}``
where the ONNX adapter's graph id is the graph's name (``<main>`` when it has none) and a node id is the ONNX
node's name. One file per measure, since Model Explorer shows one value per node per file:

* ``status.json``: 0 bit-identical, 1 propagates a difference, 2 origin, 3 inside a span (tensors in between not
  observed: the difference starts somewhere among these nodes) (thresholds: green, orange, red, purple);
* ``mismatched.json``: the share of mismatched elements (0..1) where raw tensors were kept, else the share of
  samples whose tensor differs;
* ``greatest_difference.json``: the greatest absolute difference where raw tensors were kept, else the
  greatest difference of the fingerprints' minimum, maximum and mean (a lower bound);
* ``origin.json``: 1 for an origin node, 0 for every other compared node.

A compared tensor colours the original nodes it covers (and, in the original graph, the node producing it);
the model to open is the original model (``space = "original"``) or the graph ORT ran (``"optimized"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from qconsist.diff import DiffResult
from qconsist.diff.tensors import TensorDiff, tensor_keys
from qconsist.errors import RunStoreError
from qconsist.inference.graphmap import node_names
from qconsist.inference.reader import load_dump
from qconsist.onnxfile import read_onnx
from qconsist.store.atomic import write_json_atomic
from qconsist.store.run import Run

MEASURES = ("status", "mismatched", "greatest_difference", "origin")
IDENTICAL, PROPAGATES, ORIGIN, SPAN = 0, 1, 2, 3
_STATUS_COLOURS = [{"value": IDENTICAL, "bgColor": "#a5d6a7"}, {"value": PROPAGATES, "bgColor": "#ffcc80"},
                   {"value": ORIGIN, "bgColor": "#ef5350"}, {"value": SPAN, "bgColor": "#ce93d8"}]
_GRADIENT = [{"stop": 0, "bgColor": "#fff9c4"}, {"stop": 1, "bgColor": "#c62828"}]


@dataclass
class ExplorerOverlay:
    """The node data of one diff, by measure, for the model ``model`` (its graph ``graph_id``)."""

    model: Path
    graph_id: str
    node_data: dict[str, dict[str, Any]] = field(default_factory=dict)  # measure -> Model Explorer node data
    nodes: int = 0  # nodes with a value

    def write(self, folder: Path) -> list[Path]:
        folder = Path(folder)
        paths = []
        for measure in MEASURES:
            path = folder / f"{measure}.json"
            write_json_atomic(path, self.node_data[measure])
            paths.append(path)
        return paths


def _greatest(node: TensorDiff) -> float:
    if node.elements is not None and math.isfinite(node.elements.max_abs):
        return float(node.elements.max_abs)
    side_a, side_b = node.summary.get("a") or {}, node.summary.get("b") or {}
    found = 0.0
    for key in ("min", "max", "mean"):
        x, y = side_a.get(key), side_b.get(key)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isfinite(x) and math.isfinite(y):
            found = max(found, abs(float(y) - float(x)))
    return found


def _model_of(diff: DiffResult, run: Run) -> Path:
    """The graph the diff's tensors belong to: run A's dumped graph, or (compared through the original model)
    the model it ran, verified."""
    tensors = diff.tensors
    if tensors is None:
        raise RunStoreError("the diff compared no tensors (runs without --dump): there is no per-node divergence to draw")
    if tensors.space == "optimized":
        return run.file(run.dump.optimized, "dump graph path")
    model = run.ran_model()
    if model is None:
        raise RunStoreError(f"the model run {run.path} ran ({run.manifest.model.get('path')}) is gone")
    return model


def explorer_overlay(diff: DiffResult) -> ExplorerOverlay:
    """The per-node divergence of ``diff`` (a diff of two dumped inference runs) as Model Explorer node data."""
    run_a, run_b = Run.open(diff.run_a), Run.open(diff.run_b)
    path = _model_of(diff, run_a)
    model = read_onnx(path, what="the diff's model", error=RunStoreError)
    names = node_names(model.graph)
    producer = {out: names[i] for i, node in enumerate(model.graph.node) for out in node.output if out}
    tensors = diff.tensors
    assert tensors is not None
    values: dict[str, dict[str, float]] = {m: {} for m in MEASURES}

    def put(node: str, status: int, mismatched: float, greatest: float) -> None:
        if values["status"].get(node, -1) >= status:
            return
        values["status"][node] = status
        values["mismatched"][node] = mismatched
        values["greatest_difference"][node] = greatest
        values["origin"][node] = 1 if status == ORIGIN else 0

    known = set(names)
    for node in tensors.nodes:
        share = node.elements.percent / 100 if node.elements is not None else node.count / max(tensors.samples, 1)
        targets = [n for n in (*node.covers, *node.span, node.label, producer.get(node.key)) if n in known]
        for name in dict.fromkeys(targets):
            put(name, SPAN if node.is_span else ORIGIN if node.origin else PROPAGATES, share, _greatest(node))
    keys_a = tensor_keys(load_dump(run_a), tensors.space)
    keys_b = tensor_keys(load_dump(run_b), tensors.space)
    for key in keys_a:  # the other compared tensors are bit-identical in every sample
        if key in keys_b and producer.get(key) in known:
            put(producer[key], IDENTICAL, 0.0, 0.0)
    graph_id = model.graph.name or "<main>"

    def data(measure: str, **style: Any) -> dict[str, Any]:
        results = {node: {"value": value} for node, value in values[measure].items()}
        return {graph_id: {"results": results, **style}}

    return ExplorerOverlay(path, graph_id, {
        "status": data("status", thresholds=_STATUS_COLOURS),
        "mismatched": data("mismatched", gradient=_GRADIENT),
        "greatest_difference": data("greatest_difference", gradient=_GRADIENT),
        "origin": data("origin", thresholds=[{"value": 0, "bgColor": "#e0e0e0"}, {"value": 1, "bgColor": "#ef5350"}]),
    }, len(values["status"]))
