"""A batch of four is four samples everywhere: diff, locate's comparison engine, the fp16 analysis, the
pipeline's stage check and the gate's drift check count top-1 agreement per sample, and agree with each
other and with an independent computation (issue: top-1 was computed five ways that disagreed)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from onnx_builders import build_classifier_model, save_arrays

BIAS = [0.00395229, -0.13610594, 0.00279943, -0.00548631 - 0.1, 0.08987398]  # class 3 pushed down: some flip


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("batch-agreement")
    a = build_classifier_model(folder / "a.onnx", "N")
    b = build_classifier_model(folder / "b.onnx", "N", BIAS)
    arrays = save_arrays(folder / "x.npy", 12, seed=2)
    x = np.load(arrays)
    ya = ort.InferenceSession(str(a), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    yb = ort.InferenceSession(str(b), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    expected = float(np.mean(ya.argmax(1) == yb.argmax(1)))
    assert 0.5 < expected < 1.0  # a real disagreement on some samples
    return {"a": a, "b": b, "arrays": arrays, "x": x, "expected": expected, "folder": folder}


def test_diff_counts_samples_not_steps(pair):
    from qconsist.diff import diff_runs
    from qconsist.inference import ExecutionOptions, RunRequest, run_inference
    from qconsist.inference.model import resolve_model
    from qconsist.inputs import open_input_set

    runs = {}
    for key in ("a", "b"):
        inputs = open_input_set(pair["arrays"], None, "x")
        runs[key] = run_inference(resolve_model(pair[key]), inputs, RunRequest(ExecutionOptions(), dump=True, batch_size=4),
                                  pair["folder"] / "runs", run_id=f"run-{key}").run_dir
    result = diff_runs(runs["a"], runs["b"])  # same graph, another bias: compared node by node
    assert result.outputs.samples == 12 and result.top1_agreement == pair["expected"]  # prob: class scores
    assert result.tensors.samples == 12 and result.tensors.first.label == "fc"  # the changed bias shows first at fc
    assert [n.label for n in result.tensors.origins] == ["fc"]


def test_locate_engine_stage_check_and_gate_agree_per_sample(pair):
    from qconsist.compare import ObservedGraph, ObservedNode, compare_outputs
    from qconsist.gate.checks import _compare, _drift_result
    from qconsist.gate.policy import DriftLimits
    from qconsist.locate.comparison import PairComparison
    from qconsist.inference.session import outputs_of
    from qconsist.inputs import open_input_set

    inputs = open_input_set(pair["arrays"], None, "x")
    ref, got = outputs_of(pair["a"], inputs, batch_size=4), outputs_of(pair["b"], inputs, batch_size=4)
    assert [r["prob"].shape for r in ref] == [(4, 5)] * 3  # three steps of four samples
    # the pipeline's stage check
    stage = compare_outputs(ref, got, atol=None, rtol=None)
    # the gate's drift check
    limits = DriftLimits(max_abs_diff=1.0, min_top1_agreement=0.0)
    drift = _drift_result("drift.float", "the float model", _compare(ref, got, limits), limits)
    # locate's comparison engine, on the final output node
    graph = ObservedGraph((ObservedNode("softmax", "softmax", "Softmax", (), ("prob",)),), ("prob",))
    engine = PairComparison(graph, "a", "b")
    for step, (r, g) in enumerate(zip(ref, got)):
        engine.add(step, r, g)
    located = engine.finish()
    assert stage.samples == drift.measured["samples"] == located.effect.samples == 12
    assert stage.top1_agreement == drift.measured["top1_agreement"] == located.effect.top1_agreement == pair["expected"]


def test_fp16_analysis_counts_samples_of_a_batch(pair):
    from qconsist.locate.fp16 import analyse_fp16
    from qconsist.inference.session import ExecutionOptions, OptimizationLevel

    steps = [{"x": pair["x"][i:i + 4]} for i in range(0, 12, 4)]
    report = analyse_fp16(pair["a"], steps, ExecutionOptions(graph_optimization_level=OptimizationLevel.BASIC))
    assert report.effect.samples == 12 and report.samples == 12
    # independent: the float16 model's outputs against float32's, per sample
    from onnxconverter_common import float16
    import onnx

    half = float16.convert_float_to_float16(onnx.load(str(pair["a"])), keep_io_types=True)
    session = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"])
    full = ort.InferenceSession(str(pair["a"]), providers=["CPUExecutionProvider"])
    y16, y32 = session.run(None, {"x": pair["x"]})[0], full.run(None, {"x": pair["x"]})[0]
    assert report.top1_agree == int(np.sum(y16.argmax(1) == y32.argmax(1)))
