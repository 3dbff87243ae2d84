"""The environment qconsist records and checks: the lock is what is installed, CPU and GPU builds are locked
to one version, `qconsist env` reports it, and two fingerprints are told apart by what changes results."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import onnxruntime as ort
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.environment import check_environment, compare_environments, fingerprint, locked_versions

ROOT = Path(__file__).resolve().parent.parent
MATRIX = os.environ.get("QCONSIST_MATRIX")  # set by noxfile.py's sessions: oldest, locked, newest


def _lock_versions(name: str) -> set[str]:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    return {p["version"] for p in lock["package"] if p["name"] == name}


def test_lock_pins_cpu_and_gpu_onnxruntime_to_one_version():
    cpu, gpu = _lock_versions("onnxruntime"), _lock_versions("onnxruntime-gpu")
    assert len(cpu) == 1 and cpu == gpu, (cpu, gpu)


def test_caffe2onnx_is_locked_with_a_current_onnx():
    assert _lock_versions("caffe2onnx") == {"2.0.1"}
    assert all(int(v.split(".")[1]) >= 17 for v in _lock_versions("onnx"))  # not caffe2onnx's onnx==1.6.0


def test_installed_environment_is_the_lock():
    """`make test` runs in exactly the locked environment; the matrix's oldest/newest sessions replace
    onnxruntime alone, and `qconsist env` says so."""
    locked = locked_versions()
    report = check_environment()
    assert locked["onnxruntime"] == _lock_versions("onnxruntime").pop()
    if MATRIX in (None, "locked"):
        assert ort.__version__ == locked["onnxruntime"]
        assert report.warnings == (), report.warnings
    else:
        assert ort.__version__ != locked["onnxruntime"]
        assert report.warnings == (f"onnxruntime {ort.__version__} is installed but uv.lock says {locked['onnxruntime']}: "
                                   "this is not the locked environment (make setup installs it)",)


def test_env_command_reports_versions_and_limits():
    result = CliRunner().invoke(app, ["env", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["onnxruntime"] == f"{ort.__version__} (onnxruntime)"
    assert data["fingerprint"]["packages"]["onnxruntime"] == ort.__version__
    assert data["fingerprint"]["onnxruntime_providers"] == ort.get_available_providers()
    # the limits are asked of onnxruntime: it loads the newest opset reported and refuses the next
    from onnx import TensorProto, helper

    def loads(opset: int) -> bool:
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            return True
        except Exception:  # noqa: BLE001
            return False

    assert loads(data["newest_opset"]) and not loads(data["newest_opset"] + 1)
    text = CliRunner().invoke(app, ["env"])
    assert text.exit_code == 0
    assert text.stdout.splitlines()[0] == (f"onnxruntime (module)  {ort.__version__} (onnxruntime)  "
                                           f"(loads up to opset {data['newest_opset']}, IR {data['newest_ir']})")


def test_env_warns_about_tf32_override(monkeypatch):
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    result = CliRunner().invoke(app, ["env"])
    assert result.exit_code == 0
    assert ("warning: NVIDIA_TF32_OVERRIDE=0 is set: it overrides use_tf32 for every CUDA session (0 disables TF32 "
            "everywhere), so a run's recorded cuDNN options are not what ran") in result.stdout.splitlines()


def test_compare_environments_names_what_changes_results_first():
    a = fingerprint()
    b = json.loads(json.dumps(a))
    b["packages"]["onnxruntime"] = None
    b["packages"]["onnxruntime-gpu"] = "9.9.9"
    b["onnxruntime_module"] = "9.9.9"
    b["env"]["NVIDIA_TF32_OVERRIDE"] = "0"
    b["cpu_count"] = 999
    diff = compare_environments(a, b)
    assert [str(c) for c in diff.numerics] == [
        f"onnxruntime: {ort.__version__} (onnxruntime) -> 9.9.9 (onnxruntime-gpu)",
        "NVIDIA_TF32_OVERRIDE: absent -> 0",
    ]
    assert diff.other == (f"cpu_count: {a['cpu_count']} -> 999",)
    assert compare_environments(a, a).same_numerics


def test_another_pillow_is_named_as_a_numerics_change():
    """Pillow decodes and resizes the photos: 12.3 and 13.0 resize some differently (docs/numerics.md), so a change
    of it is said with the versions that decide the numerics; a fingerprint without it is unknown, not a change."""
    a = fingerprint()
    assert a["packages"]["pillow"]
    b = json.loads(json.dumps(a))
    b["packages"]["pillow"] = "12.3.0"
    assert [str(c) for c in compare_environments(a, b).numerics] == [f"pillow: {a['packages']['pillow']} -> 12.3.0"]
    assert compare_environments(a, b).other == ()
    b["packages"]["pillow"] = None
    assert compare_environments(a, b).same_numerics
