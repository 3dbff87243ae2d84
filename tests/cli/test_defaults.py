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
