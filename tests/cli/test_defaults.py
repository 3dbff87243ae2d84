"""Defaults that do not surprise: quant-error measures a run on the run's own evaluation inputs, as sensitivity
does (not package:photos, which a model of 8x8 arrays cannot take), from the command line and from Python."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import qconsist
from onnx_builders import build_classifier_model, save_arrays
from qconsist.cli import app


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("defaults")
    build_classifier_model(folder / "cls.onnx")
    save_arrays(folder / "arrays.npy", 12, seed=2)
    (folder / "cls.toml").write_text('name = "cls"\n[model]\nonnx = "cls.onnx"\n[calibration]\ndata = "arrays.npy"\n'
                                     'count = 8\n[evaluation]\ndata = "arrays.npy"\noffset = 8\n')
    return qconsist.pipeline_run(folder / "cls.toml", runs_dir=folder / "runs", run_id="cls").path


def test_quant_error_takes_the_runs_evaluation_inputs(run):
    result = CliRunner().invoke(app, ["quant-error", str(run)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == f"{run}: quantize (cpu, level all) against optimize (cpu, level disable), 4 samples"
    sliced = CliRunner().invoke(app, ["quant-error", str(run), "--offset", "1", "--count", "2"])
    assert sliced.stdout.splitlines()[0].endswith(", 2 samples")
    refused = CliRunner().invoke(app, ["quant-error", str(run), "--pipeline", "x.toml"])
    assert refused.exit_code == 2 and refused.stderr == (
        "error: --pipeline prepares the images of --inputs: give --inputs too (without it, the run's own evaluation "
        "inputs are used, prepared as the run prepared them)\n")


def test_the_python_call_takes_them_too(run):
    error = qconsist.quant_error(run)
    assert error.samples == 4 and error.passed
    assert [e.node for e in error.tensors] == [e.node for e in qconsist.quant_error(run, count=4).tensors]


def test_a_bias_of_millionths_is_not_ranked_worst(tmp_path):
    """A bias of a few millionths rounds to 0 (SQNR 0 dB) and changes nothing: quant-error leaves it out of the
    ranking of weights, and says so."""
    build_classifier_model(tmp_path / "cls.onnx", fc_bias=[1e-7, -2e-6, 3e-6, 0.0, 1e-6])
    save_arrays(tmp_path / "arrays.npy", 12, seed=2)
    (tmp_path / "cls.toml").write_text('name = "cls"\n[model]\nonnx = "cls.onnx"\n[calibration]\ndata = "arrays.npy"\n'
                                       'count = 8\n[evaluation]\ndata = "arrays.npy"\noffset = 8\n')
    run = qconsist.pipeline_run(tmp_path / "cls.toml", runs_dir=tmp_path / "runs", run_id="tiny").path
    bias = next(w for w in qconsist.quant_error(run).weights if w.tensor == "fc_b")
    assert bias.max_abs < 3.1e-6 and bias.sqnr_db < 1.0  # what used to head the ranking
    result = CliRunner().invoke(app, ["quant-error", str(run)])
    line = next(line for line in result.stdout.splitlines() if line.startswith("weights and biases: "))
    assert line.startswith("weights and biases: 4 dequantized, lowest SQNR: conv_w (conv) ")
    assert "fc_b" not in line
    assert line.endswith("; 1 left out of the ranking: off by at most 5e-06 (--json lists them)")


def test_calib_repeat_of_an_onnx_model_on_images_takes_a_pipeline(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from old_runs import old_inputs

    made = old_inputs(tmp_path / "w", flat=True)
    result = CliRunner().invoke(app, ["calib", "repeat", str(made["model"]), "--inputs", str(made["images"]),
                                      "--pipeline", str(made["pipeline"]), "-n", "2"])
    assert result.exit_code == 0, result.output
    md5 = result.stdout.splitlines()[0].split("md5 ")[1].split()[0]
    assert result.stdout.splitlines()[-2:] == [f"2 calibrations agree: md5 {md5}", "PASS: 2 calibrations agree"]
    refused = CliRunner().invoke(app, ["calib", "repeat", str(made["pipeline"]), "--pipeline", str(made["pipeline"])])
    assert refused.exit_code == 2 and refused.stderr == (
        "error: --inputs, --pipeline and --batch-size apply to an ONNX model; a pipeline file declares [calibration] "
        "data and batch_size\n")


def _prediction_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("float model on the "))


def test_pipeline_run_shows_what_the_float_model_predicts(tmp_path):
    """The float model's top classes per evaluation sample, computed again here with onnxruntime on the
    optimize stage's model; a model that gives every input one class is pointed at [preprocess]."""
    import numpy as np
    import onnxruntime as ort

    build_classifier_model(tmp_path / "cls.onnx")
    save_arrays(tmp_path / "arrays.npy", 12, seed=2)
    (tmp_path / "cls.toml").write_text('name = "cls"\n[model]\nonnx = "cls.onnx"\n[calibration]\ndata = "arrays.npy"\n'
                                       'count = 8\n[evaluation]\ndata = "arrays.npy"\noffset = 8\n')
    result = CliRunner().invoke(app, ["pipeline", "run", str(tmp_path / "cls.toml"), "--run-id", "p"])
    assert result.exit_code == 0, result.output
    session = ort.InferenceSession("runs/p/optimize/model.onnx",
                                   providers=["CPUExecutionProvider"])
    arrays = np.load(tmp_path / "arrays.npy")
    shown = []
    for index in range(8, 12):
        scores = session.run(None, {"x": arrays[index:index + 1]})[0].reshape(-1)
        best = np.argsort(-scores, kind="stable")[:2]
        shown.append(f"{index:06d}: " + ", ".join(f"{c} ({scores[c]:.2f})" for c in best))
    assert _prediction_line(result.stdout) == (
        "float model on the 4 evaluation inputs (prob, 5 classes, top classes with scores): " + "; ".join(shown))

    build_classifier_model(tmp_path / "biased.onnx", fc_bias=[40.0, 0.0, 0.0, 0.0, 0.0])
    (tmp_path / "biased.toml").write_text((tmp_path / "cls.toml").read_text().replace('"cls.onnx"', '"biased.onnx"'))
    biased = CliRunner().invoke(app, ["pipeline", "run", str(tmp_path / "biased.toml"), "--run-id", "b"])
    lines = biased.stdout.splitlines()
    at = lines.index(_prediction_line(biased.stdout))
    assert lines[at + 1] == ("  all 4 evaluation inputs get class 0: unless they all are of it, check [preprocess] "
                             "(channel order, mean, scale, layout)")
