"""Reading cuDNN's API log: real logs written on an H100 (onnxruntime-gpu 1.31.1, cuDNN 9.14, the FCN head's
float model, 2 runs per search mode, ``CUDNN_LOGLEVEL_DBG=3``), kept compressed in tests/data/cudnn.

What they show, and these tests pin: ConvTranspose runs as a ``CONV_BWD_DATA`` graph on engine 25 under
EXHAUSTIVE and HEURISTIC, an engine cuDNN marks ``CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC``, and on engine 1
(not marked) under DEFAULT; EXHAUSTIVE's first run executes the candidates it times before the engine it keeps.
Those logs were written before the recorder's run markers existed, so the markers are inserted here where
the recorder's child writes them: before each run and after the last."""

from __future__ import annotations

import lzma
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qconsist.errors import InputError
from qconsist.inference.engines import (
    MARKER_BASE, ConvExecution, EngineRecord, assign, conv_nodes, parse_log, split_runs,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "cudnn"
EXECUTIONS = {  # engine ids of the executions, in order, over two runs
    "EXHAUSTIVE": [41, 41, 28, 25, 41, 41, 70, 28, 25, 70],
    "HEURISTIC": [70, 25, 28, 70, 25, 28],
    "DEFAULT": [1, 1, 1, 1, 1, 1],
}


def _log(mode: str) -> list[str]:
    with lzma.open(DATA / f"fcn_probe_{mode}.log.xz", "rt") as handle:
        return handle.readlines()


def _marker(run: int) -> list[str]:
    return [
        "I! CuDNN (v91400 64) function cudnnGetErrorString() called:\n",
        f"i!     status: type=cudnnStatus_t; val=CUDNN_STATUS_UNKNOWN ({MARKER_BASE + run});\n",
        "i! Time: 2026-11-23T10:15:20.000000 (0d+0h+0m+0s since start)\n", "\n", "\n",
    ]


def _with_markers(lines: list[str], after: list[int]) -> list[str]:
    """Markers before the first execution and after the executions numbered in ``after`` (1-based)."""
    out: list[str] = []
    seen = 0
    pending: list[int] = []
    for line in lines:
        if line.startswith("I! CuDNN") and pending:
            out += _marker(pending.pop())
        if "function cudnnBackendExecuteInternal() called" in line:
            if seen == 0:
                out += _marker(0)
            seen += 1
            if seen in after:
                pending.append(after.index(seen) + 1)
        out.append(line)
    while pending:
        out += _marker(pending.pop())
    return out


def _fcn_head_graph() -> onnx.ModelProto:
    """The float FCN head as ONNX Runtime ran it in those logs (its optimized graph)."""
    rng = np.random.default_rng(0)
    weights = {"convolution1_W": (64, 3, 3, 3), "deconvolution3_W": (64, 32, 4, 4), "convolution4_W": (21, 32, 1, 1)}
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in weights.items()]
    nodes = [
        helper.make_node("Conv", ["data_input", "convolution1_W"], ["conv1"], name="convolution1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv1"], ["relu"], name="relu2"),
        helper.make_node("ConvTranspose", ["relu", "deconvolution3_W"], ["upscore"], name="deconvolution3",
                         strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["upscore", "convolution4_W"], ["score"], name="convolution4"),
    ]
    graph = helper.make_graph(nodes, "fcn_head", [helper.make_tensor_value_info("data_input", TensorProto.FLOAT, [1, 3, 56, 56])],
                              [helper.make_tensor_value_info("score", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("mode", EXECUTIONS)
def test_every_convolution_execution_is_read_with_engine_and_notes(mode):
    events = parse_log(_log(mode))
    assert all(isinstance(e, ConvExecution) for e in events)
    assert [e.engine_id for e in events] == EXECUTIONS[mode]
    for e in events:
        if e.operation == "CONV_BWD_DATA":  # the ConvTranspose: dy 64x56x56 -> dx 32x112x112
            assert (e.x, e.w, e.y) == ((1, 64, 56, 56), (64, 32, 4, 4), (1, 32, 112, 112))
            assert (e.strides, e.pads, e.dilations) == ((2, 2), (1, 1), (1, 1))
            assert e.nondeterministic is (mode != "DEFAULT")
            assert ("NONDETERMINISTIC" in (e.why or "")) is (mode != "DEFAULT")
        else:
            assert e.operation == "CONV_FORWARD" and not e.nondeterministic and e.why is None
    assert events[0].engine.startswith(f"engine {EXECUTIONS[mode][0]} (tile_size=")


def test_runs_are_split_at_the_markers_and_autotune_candidates_kept_apart():
    ran, tried = split_runs(parse_log(_with_markers(_log("EXHAUSTIVE"), [7, 10])), runs=2)
    assert [[e.engine_id for e in run] for run in ran] == [[28, 25, 70], [28, 25, 70]]
    assert [e.engine_id for e in tried[0]] == [41, 41, 41, 41] and tried[1] == []
    ran, tried = split_runs(parse_log(_with_markers(_log("HEURISTIC"), [3, 6])), runs=2)
    assert [[e.engine_id for e in run] for run in ran] == [[70, 25, 28]] * 2 and tried == [[], []]


@pytest.mark.parametrize("mode", EXECUTIONS)
def test_a_log_without_markers_is_split_where_its_runs_repeat(mode):
    marked = split_runs(parse_log(_with_markers(_log(mode), [7, 10] if mode == "EXHAUSTIVE" else [3, 6])), runs=2)
    assert split_runs(parse_log(_log(mode)), runs=2) == marked


def test_partial_markers_or_an_irregular_log_are_refused():
    events = parse_log(_with_markers(_log("HEURISTIC"), [3, 6]))
    with pytest.raises(InputError, match="run markers 0..3"):
        split_runs(events, runs=3)
    with pytest.raises(InputError, match="cannot tell the 4 runs apart"):
        split_runs(parse_log(_log("HEURISTIC")), runs=4)


@pytest.mark.parametrize("mode", EXECUTIONS)
def test_executions_are_assigned_to_the_graph_nodes(mode):
    after = [7, 10] if mode == "EXHAUSTIVE" else [3, 6]
    ran, tried = split_runs(parse_log(_with_markers(_log(mode), after)), runs=2)
    nodes, unmatched = assign(ran, tried, conv_nodes(_fcn_head_graph()), {"deconvolution3": "upscore"})
    assert unmatched == []
    by_name = {n.node: n for n in nodes}
    assert list(by_name) == ["convolution1", "deconvolution3", "convolution4"]
    deconv = by_name["deconvolution3"]
    assert deconv.label == "upscore" and deconv.op_type == "ConvTranspose" and deconv.same_engine
    engine = "engine 1" if mode == "DEFAULT" else "engine 25"
    assert all(run.startswith(engine) for run in deconv.runs) and len(deconv.runs) == 2
    assert deconv.nondeterministic is (mode != "DEFAULT")
    assert not by_name["convolution1"].nondeterministic
    if mode == "EXHAUSTIVE":
        assert [t.split(" (")[0] for t in by_name["convolution1"].tried] == ["engine 41", "engine 41"]
        assert "search first executed" in by_name["convolution1"].describe(mode)
    text = deconv.describe(f"{mode}/tf32=0")
    assert text.startswith(f"upscore: ConvTranspose, {mode}/tf32=0 run 1 {engine}")
    assert ("non-deterministic by design" in text) is (mode != "DEFAULT")
    record = EngineRecord(mode, 2, tuple(nodes), (), ("a", "a"), 1.0, 0.5, 10)
    assert EngineRecord.from_json(record.to_json()) == record


def test_weights_behind_dequantize_linear_and_nodes_of_one_signature():
    """A QDQ model's Conv takes its weight from DequantizeLinear; two Convs of one signature are told apart
    by execution order and say so."""
    w = numpy_helper.from_array(np.ones((8, 8, 3, 3), np.int8), "w_q")
    scale, zero = numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.int8(0), "z")
    nodes = [
        helper.make_node("DequantizeLinear", ["w_q", "s", "z"], ["w"], name="dq"),
        helper.make_node("Conv", ["x", "w"], ["a"], name="first", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["a", "w"], ["b"], name="second", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 9, 9])],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)], [w, scale, zero])
    found = conv_nodes(helper.make_model(graph))
    assert [(n.name, n.w, n.pads) for n in found] == [("first", (8, 8, 3, 3), (1, 1)), ("second", (8, 8, 3, 3), (1, 1))]
    run = [ConvExecution("CONV_FORWARD", (1, 8, 9, 9), (8, 8, 3, 3), (1, 8, 9, 9), (1, 1), (1, 1), (1, 1),
                         f"engine {i}", i, (), "backend") for i in (3, 4)]
    nodes_found, unmatched = assign([run], [[]], found)
    assert [(n.node, n.runs, n.by_order) for n in nodes_found] == [("first", ("engine 3",), True), ("second", ("engine 4",), True)]
    assert unmatched == []
