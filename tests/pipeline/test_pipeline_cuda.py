"""The bundled CUDA-calibration pipeline: exit 3 with one line where there is no CUDA EP, nothing written;
on a GPU machine (onnxruntime-gpu) the same command calibrates on the GPU and its repeats must agree."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.inference.session import provider_available

PIPELINE = Path(__file__).resolve().parents[2] / "pipelines" / "open_nsfw_cuda.toml"


@pytest.mark.skipif(provider_available("cuda"), reason="checks the refusal where no CUDA provider runs")
def test_cuda_pipeline_without_cuda_exits_3(tmp_path):
    runs = tmp_path / "runs"
    result = CliRunner().invoke(app, ["pipeline", "run", str(PIPELINE), "--runs-dir", str(runs)])
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith("error: execution provider cuda (CUDAExecutionProvider) is not in this onnxruntime (")
    assert result.stderr.count("\n") == 1
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.gpu
def test_cuda_pipeline_calibrates_on_the_gpu_and_repeats_agree(tmp_path):
    runs = tmp_path / "runs"
    result = CliRunner().invoke(app, ["pipeline", "run", str(PIPELINE), "--runs-dir", str(runs), "--json"])
    assert result.exit_code == 0, result.output
    from qconsist.store.serde import loads

    data = loads(result.stdout)
    assert data["calib_repeat"]["agree"] is True and len(data["calib_repeat"]["runs"]) == 3
    assert data["checks"]["quantize"]["outputs_vs_optimize"]["top1_agreement"] == 1.0
