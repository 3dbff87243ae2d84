"""``qconsist locate`` on this machine: no GPU (exit 3), option errors (exit 2), fp16 on the CPU (exit 0/1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.errors import RunStoreError
from qconsist.inference.session import provider_available
from qconsist.locate.run import REPORT_FILE, load_report
from qconsist.store.rundir import open_run

from .test_fp16 import build_overflow_model

REPO = Path(__file__).resolve().parents[2]
PIPELINE = str(REPO / "pipelines" / "open_nsfw.toml")
runner = CliRunner()


@pytest.mark.skipif(provider_available("cuda"), reason="this machine has a usable CUDA GPU")
def test_without_a_gpu_locate_says_so_in_one_line(nsfw_models):
    result = runner.invoke(app, ["locate", str(nsfw_models["qdq"]), "--inputs", "package:photos", "--pipeline", PIPELINE])
    assert result.exit_code == 3
    assert result.stderr.startswith("error: execution provider cuda (CUDAExecutionProvider) is not in this onnxruntime (")
    assert result.stderr.endswith("for cuda install onnxruntime-gpu (qconsist[gpu]) on a machine with an NVIDIA GPU\n")
    assert result.stderr.count("\n") == 1
    assert not Path("runs").exists()


@pytest.mark.parametrize("args, message", [
    (["--config", "FAST"], "error: unknown cudnn_conv_algo_search 'FAST'; use one of EXHAUSTIVE, HEURISTIC, DEFAULT\n"),
    (["--config", "HEURISTIC", "--no-tf32"],
     "error: --config lists the configurations itself; drop --cudnn-conv-algo-search, --tf32 and the variants\n"),
    (["--cudnn-conv-algo-search", "FAST"], "error: unknown cudnn_conv_algo_search 'FAST'; use one of EXHAUSTIVE, HEURISTIC, DEFAULT\n"),
    (["--ep", "cpu"], "error: model model.onnx does not exist\n"),  # the CPU matrix (issue 28) checks its model first
    (["--precision", "fp8"], "error: --precision must be one of fp32, fp16, not 'fp8'\n"),
    (["--repeats", "1"], "error: --repeats must be an integer >= 2 (fresh sessions per config), got 1\n"),
    (["--count", "0"], "error: --count must be between 1 and 256, got 0\n"),
    (["--calibration-repeats", "1"], "error: --calibration-repeats must be 0 (off) or >= 2, got 1\n"),
    (["--max-cost", "0.9"], "error: --max-cost must be >= 1.0 (a ratio to the fastest config), got 0.9\n"),
])
def test_option_errors(args, message):
    result = runner.invoke(app, ["locate", "model.onnx", "--inputs", "package:photos", *args])
    assert result.exit_code == 2
    assert result.stderr == message


def test_missing_model_is_an_input_error():
    result = runner.invoke(app, ["locate", "missing.onnx", "--inputs", "package:photos"])
    assert result.exit_code == 2
    assert result.stderr == "error: model missing.onnx does not exist\n"


def test_fp16_on_the_cpu_writes_a_locate_run(nsfw_models):
    result = runner.invoke(app, [
        "locate", str(nsfw_models["float"]), "--inputs", "package:photos", "--pipeline", PIPELINE,
        "--precision", "fp16", "--fp16-ep", "cpu", "--count", "2", "--run-id", "fp16-cpu",
    ])
    assert result.exit_code == 0, result.output
    assert "fp16 (cpu EP, 2 samples;" in result.stdout
    assert "no NaN, Inf or overflow" in result.stdout
    assert "top-1 agrees 2/2" in result.stdout
    manifest = open_run(Path("runs/fp16-cpu"))
    assert manifest.kind == "locate"
    assert manifest.sections["locate"]["passed"] is True
    assert manifest.sections["locate"]["fp16_passed"] is True
    assert manifest.inputs["count"] == 2 and manifest.inputs["digest"].startswith("xxh3-128:")  # the digest kind since 0.2
    report = load_report(Path("runs/fp16-cpu"))
    assert report.recommendation is None and report.configs == []
    assert report.fp16.top1_agree == 2
    assert json.loads(Path("runs/fp16-cpu", REPORT_FILE).read_text())["schema"] == "qconsist.locate/1"


def test_fp16_overflow_exits_1_and_names_the_node(tmp_path):
    model = build_overflow_model(tmp_path / "overflow.onnx")
    import numpy as np

    np.save(tmp_path / "x.npy", np.random.default_rng(7).random((2, 3, 6, 6), dtype=np.float32))
    result = runner.invoke(app, [
        "locate", str(model), "--inputs", str(tmp_path / "x.npy"), "--precision", "fp16", "--ep", "cpu", "--json",
    ])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["passed"] is False
    assert data["fp16"]["first_overflow"]["label"] == "conv_big"
    assert Path(data["run_dir"]).is_dir()


def test_load_report_refuses_other_runs(tmp_path):
    with pytest.raises(RunStoreError, match="does not exist"):
        load_report(tmp_path / "nothing")
