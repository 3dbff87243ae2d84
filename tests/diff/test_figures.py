"""Figures that mean something (issue 27 item 7): identical tensors are reported as identical (no dB: ORT's
formula gives them the float epsilon's 300-odd dB), a reference of zeros has no SQNR (not "0.00 dB, cosine 1.0"),
neither is ranked by quant-error's ``--sort added``, and the gate never prints "difference 0 at []"."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from judge_models import identical_and_zero_branch
from onnx_builders import save_arrays
from qconsist.cli import app
from qconsist.compare import compare_outputs
from qconsist.compare.kinds import JudgedOutput, OutputKind
from qconsist.compare.noise import NoiseStats
from qconsist.gate.checks import _drift_result
from qconsist.gate.policy import DriftLimits
from qconsist.pipeline.config import parse_pipeline
from qconsist.pipeline.runner import run_pipeline


@pytest.fixture(scope="module")
def branch_run(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("figures")
    model, arrays = identical_and_zero_branch(folder / "branch.onnx"), save_arrays(folder / "arrays.npy", 4, seed=2)
    config = parse_pipeline({"name": "branch", "model": {"onnx": str(model)}, "calibration": {"data": str(arrays)},
                             "quantize": {"format": "QDQ", "op_types": ["Conv"]}}, folder / "pipeline.toml")
    return run_pipeline(config, runs_dir=folder / "runs", run_id="branch").path, arrays


def test_quant_error_reports_identical_tensors_as_identical_and_ranks_them_last(branch_run, monkeypatch):
    run, arrays = branch_run
    monkeypatch.setenv("COLUMNS", "200")
    out = CliRunner().invoke(app, ["quant-error", str(run), "--inputs", str(arrays), "--sort", "added"])
    assert out.exit_code == 0, out.output
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.stdout.splitlines() if line.startswith("│")]
    assert [(r[0], r[2], r[3]) for r in rows] == [
        ("conv", "37.95", "all (inputs identical)"),  # every input identical: its noise starts here
        ("relu", "37.80", "0.15"),
        ("scale", "identical", "-"), ("double", "identical", "-"), ("shrink", "identical", "-"),
        ("zero", "identical", "-"), ("mean", "identical", "-"),
    ]
    assert all(r[6] == "-" for r in rows if r[2] == "identical")  # no cosine either
    data = json.loads(CliRunner().invoke(app, ["quant-error", str(run), "--inputs", str(arrays), "--json"]).stdout)
    by_tensor = {e["tensor"]: e for e in data["tensors"]}
    assert {t: (e["figure"], e["added_db"]) for t, e in by_tensor.items() if e["figure"] != "measured"} == {
        "scaled": ("identical", None), "side": ("identical", None), "small": ("identical", None),
        "zeros": ("identical", None), "zero_mean": ("identical", None)}
    assert by_tensor["conv"]["noise_starts"] is True and by_tensor["conv"]["added_db"] is None


def test_a_reference_of_zeros_has_no_sqnr():
    stats = NoiseStats()
    stats.add(np.zeros(6, np.float32), np.array([0, 0.5, 0, 0, 0, 0], np.float32))
    assert (stats.figure, stats.measured_sqnr_db, stats.max_abs) == ("zero-signal", None, 0.5)
    same = NoiseStats()
    same.add(np.zeros(6, np.float32), np.zeros(6, np.float32))
    assert (same.figure, same.measured_sqnr_db) == ("identical", None)
    measured = NoiseStats()
    measured.add(np.ones(4, np.float32), np.array([1, 1, 1, 1.1], np.float32))
    assert measured.figure == "measured" and measured.measured_sqnr_db == pytest.approx(26.0206, abs=1e-3)
    judged = compare_outputs([{"heat": np.zeros((1, 2, 3), np.float32)}], [{"heat": np.full((1, 2, 3), 0.25, np.float32)}],
                             None, None, [JudgedOutput("heat", OutputKind.MAP, "declared")])
    assert judged.judgements[0].describe() == (
        "heat (map): zero signal (the reference is all zero), greatest difference 0.25")


def test_the_gate_reports_identical_outputs_as_identical():
    values = [{"prob": np.array([[0.1, 0.7, 0.2]], np.float32)} for _ in range(3)]
    comparison = compare_outputs(values, [dict(v) for v in values], 0.0, 0.0,
                                 [JudgedOutput("prob", OutputKind.CLASS_SCORES, "declared")])
    result = _drift_result("drift.baseline", "the baseline", comparison, DriftLimits(max_abs_diff=0.0, min_top1_agreement=1.0))
    assert result.message == ("against the baseline: the outputs are bit-identical, top-1 agreement 100.0% over 3 samples; "
                              "prob (class-scores): identical in 3 samples")
    assert comparison.below(40.0) == []


def test_a_zero_signal_output_below_the_floor_says_so():
    from qconsist.stages.quantize import floor_failures

    comparison = compare_outputs([{"heat": np.zeros((1, 2, 3), np.float32)}], [{"heat": np.full((1, 2, 3), 0.25, np.float32)}],
                                 None, None, [JudgedOutput("heat", OutputKind.MAP, "declared")])
    assert floor_failures(comparison, 15.0) == [
        "output heat (map): zero signal (the reference is all zero), greatest difference 0.25, against the float model, "
        "below the floor of 15 dB"]
    result = _drift_result("drift.float", "the float model", comparison, DriftLimits(min_sqnr_db=15.0))
    assert result.message.startswith(
        "against the float model: output heat (map) zero signal (the reference is all zero), greatest difference 0.25: "
        "no SQNR to reach 15 dB; greatest absolute difference 0.25")
