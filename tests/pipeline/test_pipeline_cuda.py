"""The bundled CUDA-calibration pipeline: exit 3 with one line where there is no CUDA EP, nothing written;
on a GPU machine (onnxruntime-gpu) the same command calibrates on the GPU and its repeats must agree."""

from pathlib import Path

import onnxruntime as ort
from typer.testing import CliRunner

from qconsist.cli import app

PIPELINE = Path(__file__).resolve().parents[2] / "pipelines" / "open_nsfw_cuda.toml"


def test_cuda_pipeline(tmp_path):
    runs = tmp_path / "runs"
    result = CliRunner().invoke(app, ["pipeline", "run", str(PIPELINE), "--runs-dir", str(runs)])
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert result.exit_code == 3, result.output
        assert result.output.strip().splitlines()[-1].startswith(
            "error: CUDAExecutionProvider is not available in this onnxruntime (")
        assert not runs.exists() or not any(runs.iterdir())
    else:
        assert result.exit_code == 0, result.output
        assert "calibration repeat: 3 calibrations agree" in result.output
