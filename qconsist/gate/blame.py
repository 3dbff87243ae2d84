"""Where a quantized output below the SQNR floor lost its signal: ``quant-error``'s ranking, read for it.

``quantization_error`` (``qconsist.diff.quantization``) measures every node of the quantized model against the
float one, and each node's *added* SQNR (its nearest matched inputs' worst SQNR minus its own: what the node
loses). For a failing output, the nodes that lose most among those that compute it (its ancestors in the float
graph) are named, the most first. For a failing *part* of an output (``qconsist.compare.kinds``: one input of
the Concat that makes it), the Concat itself is measured too: the SQNR of the tensor it takes in against the
part it gives out — a part can be destroyed there alone (its values rounded in the scale of another part),
which no per-tensor figure shows.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Sequence

import onnx

from qconsist.compare.kinds import JudgedOutput
from qconsist.diff.quantization import QuantErrorResult, TensorError, quantization_error
from qconsist.errors import RunStoreError
from qconsist.gate.evidence import Side, evaluation_inputs, load_side
from qconsist.inference.graphmap import node_reads
from qconsist.onnxfile import read_onnx
from qconsist.store.serde import to_number

log = logging.getLogger(__name__)

MAX_SAMPLES = 8  # quant-error observes every tensor of both models: a few samples name the nodes well enough


def _ancestors(model: onnx.ModelProto, tensor: str) -> set[str]:
    """``tensor`` and every tensor computed on the way to it."""
    producer = {out: node for node in model.graph.node for out in node.output}
    found, todo = set(), [tensor]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        node = producer.get(name)
        if node is not None:
            todo += node_reads(node)  # with the outer tensors its subgraphs read
    return found


def _ranked(errors: Sequence[TensorError], within: set[str], floor: float, top: int) -> list[TensorError]:
    """The nodes computing the output where the signal fell below ``floor`` (their worst input at or above it,
    their output below), most lost first; where none did, the nodes that lose most. A node after the model's
    exact input "loses" hundreds of dB by quantizing it at all: it is named only where it falls below the floor."""
    losing = [e for e in errors if e.tensor in within and e.added_db is not None and e.added_db > 0]
    crossing = [e for e in losing if e.sqnr_db < floor <= e.sqnr_db + e.added_db]  # type: ignore[operator]
    return sorted(crossing or losing, key=lambda e: (-e.added_db, e.position))[:top]  # type: ignore[operator]


def explain(result: QuantErrorResult, model: onnx.ModelProto, target: JudgedOutput, sqnr_db: float, floor: float,
            top: int = 3) -> str:
    """One line: where ``target`` (measured at ``sqnr_db``, below ``floor``) lost its signal, from ``result``."""
    errors = [*result.tensors, *result.outputs]
    by_tensor = {e.tensor: e for e in errors}
    tensor = target.source or target.output
    text = ""
    if target.source:
        concat = next((n for n in model.graph.node if target.output in n.output), None)
        taken = by_tensor.get(target.source)
        name = f"{concat.op_type} '{concat.name or target.output}'" if concat is not None else "the node making it"
        if taken is not None:
            text = (f"{name} takes {target.source} at {taken.sqnr_db:.1f} dB and gives it out at {sqnr_db:.1f} dB "
                    f"(loses {taken.sqnr_db - sqnr_db:.1f} dB there)")
    ranked = _ranked(errors, _ancestors(model, tensor), floor, top)
    if ranked:
        nodes = ", ".join(f"{e.node} ({e.op_type}, {e.sqnr_db + e.added_db:.1f} -> {e.sqnr_db:.1f} dB)" for e in ranked)  # type: ignore[operator]
        text += ("; " if text else "") + f"nodes losing most on the way (quant-error, SQNR in -> out): {nodes}"
    return text or "quant-error matched no node computing it"


def losing_nodes(side: Side, failing: Mapping[str, float], judged: Sequence[JudgedOutput], floor: float,
                 top: int = 3) -> dict[str, str]:
    """For each failing output or part (label -> its SQNR), one line saying where it lost its signal, from
    ``quant-error`` of the side's pipeline run on (the first ``MAX_SAMPLES`` of) its evaluation inputs."""
    if not failing:
        return {}
    float_stage = side.float_stage()
    float_path = side.artifact(float_stage) if float_stage else None
    if float_stage is None or float_path is None:
        return {}
    inputs = evaluation_inputs(side)
    result = quantization_error(side.pipeline, inputs.subset(0, min(MAX_SAMPLES, len(inputs))), float_stage=float_stage)
    model = read_onnx(float_path, error=RunStoreError)
    targets = {j.label: j for j in judged}
    return {label: explain(result, model, targets[label], sqnr, floor, top) for label, sqnr in failing.items() if label in targets}


def blame_pipeline_run(run_dir: Path | str) -> dict[str, str]:
    """For a pipeline run whose quantize check found outputs below the SQNR floor (its manifest's
    ``below_floor``): where each lost its signal (``losing_nodes``); empty when none did."""
    side = load_side(Path(run_dir))
    check = next((value for key, value in ((side.stage("quantize") or {}).get("checks") or {}).items()
                  if key.startswith("outputs_vs_") and isinstance(value, dict)), None)
    if not check or not check.get("below_floor"):
        return {}
    measured = {entry["label"]: to_number(entry["sqnr_db"]) for entry in check.get("judged") or [] if isinstance(entry, dict)}
    failing = {label: measured[label] for label in check["below_floor"] if label in measured}
    return losing_nodes(side, failing, side.judged(), float(check.get("min_sqnr_db") or 0.0))
