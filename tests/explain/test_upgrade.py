"""``qconsist upgrade-check`` for real: a second environment built from uv.lock with another onnxruntime pin,
the same small model run with dumps in both, and the diff (version change first)."""

from __future__ import annotations

import json
import subprocess

import onnxruntime as ort
from typer.testing import CliRunner

from onnx_builders import build_classifier_model, save_arrays
from qconsist.cli import app


def test_upgrade_check_builds_the_other_environment_and_compares(tmp_path):
    model = build_classifier_model(tmp_path / "classifier.onnx")
    arrays = save_arrays(tmp_path / "x.npy", 6, seed=2)
    other = "1.31.0" if ort.__version__ != "1.31.0" else "1.31.1"  # another supported release than the one here
    result = CliRunner().invoke(app, ["upgrade-check", str(model), "--inputs", str(arrays), "--onnxruntime", other,
                                      "--env-dir", str(tmp_path / "env"), "--runs-dir", str(tmp_path / "runs"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "qconsist.upgrade/1"
    assert report["environment"]["onnxruntime"] == other and report["environment"]["built"] is True
    # the second environment really runs the other release, and the diff names the version change
    printed = subprocess.run([str(tmp_path / "env" / "bin" / "python"), "-c", "import onnxruntime; print(onnxruntime.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert printed == other
    # and it has what the main job needs: package:photos and Caffe conversion (extras)
    found = subprocess.run([str(tmp_path / "env" / "bin" / "python"), "-c",
                            "import caffe2onnx; from qconsist.inputs.photos import package_photos; print(len(package_photos()))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert found == "21"
    assert report["passed"] is True and report["diff"]["outputs"]["identical"] is True
    assert report["diff"]["outputs"]["samples"] == 6 and report["diff"]["outputs"]["greatest_abs"] == 0.0
    assert {"name": "onnxruntime", "old": f"{ort.__version__} (onnxruntime)", "new": f"{other} (onnxruntime)"} in \
        report["diff"]["versions"]["numerics"]
