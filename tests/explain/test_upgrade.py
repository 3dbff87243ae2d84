"""``qconsist upgrade-check`` for real: a second environment built from uv.lock with another onnxruntime pin,
the same small model run with dumps in both, and the diff (version change first)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

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


def test_upgrade_check_isa_makes_both_runs_under_the_emulated_processor(tmp_path):
    import numpy as np

    from isa_models import saturating_inputs, saturating_qlinear_model
    from qconsist.cpu import instruction_set
    from qconsist.store.run import Run

    model = saturating_qlinear_model(tmp_path / "qlinear.onnx")
    inputs = saturating_inputs(tmp_path / "x.npy", 2)
    other = "1.31.0" if ort.__version__ != "1.31.0" else "1.31.1"
    args = ["upgrade-check", str(model), "--inputs", str(inputs), "--onnxruntime", other, "--threads", "1",
            "--env-dir", str(tmp_path / "env"), "--runs-dir", str(tmp_path / "runs"), "--isa", "haswell"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["isa"] == "Haswell" and report["instruction_set"]["kernels"] == "AVX2 without VNNI"
    assert report["instruction_set"]["emulated"] == "Haswell"
    assert set(report["emulated_seconds"]) == {"A", "B"} and min(report["emulated_seconds"].values()) > 1.0
    runs = [Run.open(report[key]) for key in ("run_a", "run_b")]
    assert [run.manifest.environment["cpu_isa"]["emulated"] for run in runs] == ["Haswell", "Haswell"]
    assert [run.manifest.environment["onnxruntime_module"] for run in runs] == [ort.__version__, other]
    # both versions saturate on Haswell: sample 0, channel 0 (all weights +127) is 0.25 where the exact sum gives 13.5
    for run in runs:
        assert float(np.load(Path(run.path) / "outputs" / "o0.npy")[0, 0, 0, 0, 0]) == 0.25
    if not instruction_set().saturates:
        native = CliRunner().invoke(app, ["run", str(model), "--inputs", str(inputs), "--threads", "1", "--runs-dir",
                                          str(tmp_path / "runs"), "--run-id", "native"])
        assert native.exit_code == 0, native.output
        assert float(np.load(tmp_path / "runs" / "native" / "outputs" / "o0.npy")[0, 0, 0, 0, 0]) == 13.5
    assert report["passed"] is True and report["diff"]["outputs"]["identical"] is True
    from qconsist.store.serde import encode
    from qconsist.upgrade.check import UpgradeResult

    assert encode(UpgradeResult.from_json(report)) == encode(report)
    text = CliRunner().invoke(app, args)  # the environment and its bytecode are there now
    assert text.exit_code == 0, text.output
    line = next(line for line in text.output.splitlines() if line.startswith("both runs under emulated Haswell"))
    assert line.startswith("both runs under emulated Haswell (QEMU user mode; the runs took A ")
    assert line.endswith("); instruction set: AVX2 without VNNI (emulated Haswell under QEMU "
                         f"{runs[0].manifest.environment['cpu_isa']['qemu']}; Intel Core Processor (Haswell))")


def test_upgrade_check_isa_without_qemu_or_with_an_unknown_model_says_so(tmp_path, monkeypatch):
    from onnx_builders import build_classifier_model, save_arrays

    model = build_classifier_model(tmp_path / "classifier.onnx")
    arrays = save_arrays(tmp_path / "x.npy", 2, seed=2)
    args = ["upgrade-check", str(model), "--inputs", str(arrays), "--onnxruntime", "1.31.0",
            "--env-dir", str(tmp_path / "env"), "--runs-dir", str(tmp_path / "runs")]
    out = CliRunner().invoke(app, [*args, "--isa", "pentium9"])
    assert out.exit_code == 2
    line = out.output.strip().splitlines()[-1]
    assert line.startswith("error: --isa 'pentium9' is not a CPU model QEMU knows: use native or one of ")
    assert ", Haswell, " in line
    monkeypatch.setenv("PATH", str(tmp_path))  # no qemu-x86_64 on it
    out = CliRunner().invoke(app, [*args, "--isa", "haswell"])
    assert out.exit_code == 3
    assert out.output.strip().splitlines() == [
        "error: --isa runs the model under QEMU user mode, and qemu-x86_64 is not installed: install the qemu-user "
        "package (apt-get install qemu-user; `make qemu` does it)"]
    assert not (tmp_path / "env").exists()  # refused before the environment is built
