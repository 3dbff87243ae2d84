"""On the GPU machine: the CUDA EP's own warnings ("OP Conv(convolution1) running in Fallback mode. May be
extremely slow", logged by its kernels from each session's first run) never land between qconsist's lines.
``qconsist locate`` on the FCN head and a pipeline calibrating on the CUDA EP leave on stderr nothing but the
one-line summary; the lines are in the run directory's ``onnxruntime.log``. Run with ``pytest -m gpu`` there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from qconsist.inference.session import provider_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not provider_available("cuda"), reason="needs onnxruntime-gpu and a CUDA GPU"),
]

REPO = Path(__file__).resolve().parents[2]
QCONSIST = Path(sys.executable).parent / "qconsist"
NOTE = re.compile(r"note: onnxruntime logged \d+ (line|warning|error)\(s\)[^\n]*\n")


def _qconsist(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(QCONSIST), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=1800)


def test_locate_on_the_fcn_head_leaves_stderr_clean(tmp_path):
    built = _qconsist("pipeline", "run", REPO / "pipelines" / "fcn_head.toml", "--runs-dir", "runs", "--run-id", "fcn", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    located = _qconsist("locate", "runs/fcn", "--stage", "quantize", "--inputs", "package:photos", "--count", "4",
                        "--runs-dir", "runs", "--run-id", "located", cwd=tmp_path)
    assert located.returncode in (0, 1), located.stderr
    assert located.stderr == "" or NOTE.fullmatch(located.stderr), located.stderr[:3000]
    assert "onnxruntime:" not in located.stdout
    log = tmp_path / "runs" / "located" / "onnxruntime.log"
    if located.stderr:  # what the summary counted is kept in the run
        assert log.is_file() and str(Path("runs") / "located" / "onnxruntime.log") in located.stderr
        print(f"onnxruntime.log of locate: {len(log.read_text().splitlines())} lines; {located.stderr.strip()}")


def test_calibration_on_the_cuda_ep_leaves_stderr_clean(tmp_path):
    pipeline = tmp_path / "fcn_cuda.toml"
    text = (REPO / "pipelines" / "fcn_head.toml").read_text().replace("[calibration]\n", '[calibration]\nprovider = "cuda"\n'
                                                                      'cudnn_conv_algo_search = "EXHAUSTIVE"\n')
    pipeline.write_text(text)
    done = _qconsist("pipeline", "run", pipeline, "--runs-dir", "runs", "--run-id", "cuda", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr  # 1: the calibrations disagree under EXHAUSTIVE, as they do there
    assert done.stderr == "" or NOTE.fullmatch(done.stderr), done.stderr[:3000]
