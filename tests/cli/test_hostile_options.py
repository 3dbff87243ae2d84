"""Every numeric option has a range and every name a known value: ``--threads`` bounded, an unknown
``--disable-optimizer`` name, a fractional ``resize`` and a ``QCONSIST_MAX_FILE_BYTES`` that is not a number are
refused in one line, never recorded or replaced by a default (issue 29, items 7 and 11)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from onnx_builders import build_classifier_model, save_arrays
from qconsist.cli import app
from qconsist.errors import ConfigError
from qconsist.inference.session import ExecutionOptions

runner = CliRunner()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("options")
    return {"model": build_classifier_model(folder / "classifier.onnx"), "arrays": save_arrays(folder / "arrays.npy", 3, seed=2)}


def _run(made, tmp_path, *extra, env=None):
    return runner.invoke(app, ["run", str(made["model"]), "--inputs", str(made["arrays"]), "--runs-dir", str(tmp_path / "runs"),
                               *extra], env=env)


def test_an_unknown_optimizer_name_is_refused(made, tmp_path):
    result = _run(made, tmp_path, "--disable-optimizer", "ConstantFolding", "--disable-optimizer", "Bananas")
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    first, known = result.stderr.split("; known for this model: ")
    assert first == "error: --disable-optimizer Bananas: onnxruntime has no graph transformer or rewrite rule of that name (it would ignore it)"
    names = known.strip().split(", ")
    assert {"ConstantFolding", "EliminateIdentity", "TransposeOptimizer", "ConvActivationFusion"} <= set(names) and names == sorted(names)
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def test_known_optimizer_names_are_recorded(made, tmp_path):
    result = _run(made, tmp_path, "--disable-optimizer", "EliminateIdentity", "--disable-optimizer", "ConstantFolding",
                  "--run-id", "disabled")
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "runs" / "disabled" / "manifest.json").read_text())
    assert manifest["sections"]["inference"]["options"]["disabled_optimizers"] == ["ConstantFolding", "EliminateIdentity"]


def test_threads_have_a_range(made, tmp_path):
    result = _run(made, tmp_path, "--threads", "100000")
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    assert result.stderr == ("error: intra_op_threads 100000 is more than 1024, the most qconsist starts (each thread takes memory; "
                             "past the cores they only wait): give at most the machine's cores, or 0 for onnxruntime's default\n")
    assert ExecutionOptions(intra_op_threads=1024).intra_op_threads == 1024
    with pytest.raises(ConfigError, match=r"intra_op_threads 1025 is more than 1024"):
        ExecutionOptions(intra_op_threads=1025)


@pytest.mark.parametrize("value", ["[32.5, 32]", "[32, true]", '"32x32"', "[32.0, 32.0]"])
def test_resize_takes_integers_only(made, tmp_path, value):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[model]\nonnx = "{made["model"]}"\n[preprocess]\nresize = {value}\n[calibration]\ndata = "package:photos"\n')
    result = runner.invoke(app, ["pipeline", "run", str(pipeline), "--runs-dir", str(tmp_path / "runs")])
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    import tomllib

    shown = tomllib.loads(f"v = {value}")["v"]
    assert result.stderr == f"error: {pipeline}: preprocess.resize must be [height, width] of positive integers, got {shown!r}\n"


@pytest.mark.parametrize("value", ["banana", "-5", "0", "1e9"])
def test_max_file_bytes_is_a_positive_number(made, tmp_path, value):
    done = _run(made, tmp_path, "--json")
    assert done.exit_code == 0
    run = tmp_path / "runs" / json.loads(done.stdout)["run_dir"].rsplit("/", 1)[-1]
    result = runner.invoke(app, ["verify", str(run)], env={"QCONSIST_MAX_FILE_BYTES": value})
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    assert result.stderr == (f"error: QCONSIST_MAX_FILE_BYTES={value!r}: give the largest file qconsist reads, a positive number "
                             "of bytes (default 68719476736)\n")
    assert runner.invoke(app, ["verify", str(run)], env={"QCONSIST_MAX_FILE_BYTES": "100000"}).exit_code == 0
