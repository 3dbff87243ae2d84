"""Pipeline runs: the open_nsfw run directory and manifest, ONNX entry, interrupted and failed runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from qconsist.errors import FidelityError
from qconsist.inputs.record import read_samples
from qconsist.pipeline.config import parse_pipeline
from qconsist.pipeline.runner import PipelineResult, run_pipeline
from qconsist.store.rundir import RUNNING_NAME, open_run, run_state
from qconsist.store.run import Run


def test_open_nsfw_run_directory(nsfw_run):
    path = nsfw_run.path
    assert run_state(path) == "complete" and not (path / RUNNING_NAME).exists()
    assert sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()) == [
        "convert/model.onnx", "inputs/calibration.jsonl", "inputs/evaluation.jsonl", "manifest.json",
        "optimize/model.onnx", "quantize/calibration_ranges.json", "quantize/model.onnx",
    ]
    manifest = open_run(path)
    assert manifest.kind == "pipeline" and manifest.run_id == "open_nsfw-fixture"
    assert [s["name"] for s in manifest.stages] == ["convert", "optimize", "quantize"]
    for stage in manifest.stages:
        artifact = stage["artifact"]
        data = (path / artifact["path"]).read_bytes()
        assert artifact["md5"] == hashlib.md5(data).hexdigest() == nsfw_run.artifacts[stage["name"]].md5
        assert artifact["sha256"] == hashlib.sha256(data).hexdigest() and artifact["size"] == len(data)
        assert len(artifact["initializers"]) > 100 and stage["seconds"] > 0
    convert = manifest.stage("convert")
    assert convert["params"]["opset"] == 17 and convert["params"]["check"] is True
    checks = convert["checks"]
    assert checks["onnx_checker"] == checks["onnxruntime_load"] == "passed"
    assert checks["caffe_reference"]["passed"] is True and checks["caffe_reference"]["max_abs"] < 1e-5
    assert manifest.model["source"] == "open_nsfw"
    assert manifest.model["files"]["caffemodel"]["sha256"] == "74b7c0374425c2b324f73b134f8a7254eab9bbddc9e452a22d934b8c17015ad2"


def test_manifest_inputs_calibration_environment(nsfw_run):
    manifest = open_run(nsfw_run.path)
    calibration, evaluation = manifest.inputs["calibration"], manifest.inputs["evaluation"]
    assert calibration["count"] == 12 and evaluation["count"] == 9
    names = {role: read_samples(Run.open(nsfw_run.path), manifest.inputs[role]).names for role in ("calibration", "evaluation")}
    assert names["calibration"][:2] == ["astronaut.png", "chelsea.png"] and not set(names["calibration"]) & set(names["evaluation"])
    assert (len(names["calibration"]), len(names["evaluation"])) == (12, 9) and "names" not in calibration
    assert calibration["digest"].startswith("xxh3-128:") and calibration["digest"] != evaluation["digest"]
    assert (calibration["offset"], evaluation["offset"]) == (0, 12)
    assert calibration["preprocess"]["mean"] == [104.0, 117.0, 123.0]
    assert manifest.calibration["ranges_file"] == "quantize/calibration_ranges.json"
    assert manifest.calibration["issues"] == [] and len(manifest.calibration["table"]) > 150
    env = manifest.environment
    assert env["packages"]["onnxruntime"] and env["python"] and "OMP_NUM_THREADS" in env["env"]
    repeat = manifest.sections["calib_repeat"]
    assert repeat["agree"] is True and len(repeat["runs"]) == 3
    assert {r["md5"] for r in repeat["runs"]} == {manifest.stage("quantize")["artifact"]["md5"]}
    assert manifest.sections["pipeline"]["calibration"]["repeat"] == 3


def test_result_round_trips(nsfw_run):
    again = PipelineResult.from_json(json.loads(json.dumps(nsfw_run.to_json())))
    assert again.to_json() == nsfw_run.to_json() and again.passed and bool(again)


def _onnx_pipeline(small_models, **calibration) -> dict:
    return {
        "name": "small",
        "model": {"onnx": str(small_models["classifier"])},
        "calibration": {"data": str(small_models["arrays"]), "count": 8, **calibration},
        "quantize": {"per_channel": True},
        "evaluation": {"data": str(small_models["arrays"]), "offset": 8},
    }


def test_onnx_entry_skips_convert(small_models, tmp_path):
    config = parse_pipeline(_onnx_pipeline(small_models, repeat=2), tmp_path / "small.toml")
    result = run_pipeline(config, runs_dir=tmp_path / "runs", run_id="small-1")
    manifest = open_run(result.path)
    convert = manifest.stage("convert")
    assert convert["params"]["entry"] == "onnx" and convert["params"]["opset"] == 17
    assert convert["artifact"]["md5"] == hashlib.md5(Path(small_models["classifier"]).read_bytes()).hexdigest()
    assert manifest.inputs["evaluation"]["count"] == 4 and manifest.inputs["calibration"]["count"] == 8
    assert result.repeat.agree and len(result.repeat.runs) == 2


def test_user_error_removes_the_run_directory(small_models, tmp_path):
    data = _onnx_pipeline(small_models)
    data["model"]["onnx"] = str(small_models["pad_pool"])
    data["evaluation"] = {"data": str(small_models["arrays"]), "offset": 8}
    with pytest.raises(FidelityError, match=r"tensor 'pad_value' \(consumed by pad\) has an infinite scale"):
        run_pipeline(parse_pipeline(data, tmp_path / "p.toml"), runs_dir=tmp_path / "runs")
    assert list((tmp_path / "runs").iterdir()) == []


def test_invalid_scales_can_be_allowed_and_are_recorded(small_models, tmp_path):
    data = _onnx_pipeline(small_models)
    data["model"]["onnx"] = str(small_models["pad_pool"])
    data["quantize"]["allow_invalid_scales"] = True
    result = run_pipeline(parse_pipeline(data, tmp_path / "p.toml"), runs_dir=tmp_path / "runs")
    issues = open_run(result.path).calibration["issues"]
    assert {(i["tensor"], i["problem"]) for i in issues} >= {("pad_value", "inf"), ("padded", "inf")}
    assert result.issues == issues


class _Interrupt:
    """A progress reporter that is interrupted (Ctrl-C) when calibration starts."""

    def task(self, description, total):
        if description == "calibrating":  # the stages before it report their own tasks
            raise KeyboardInterrupt
        from qconsist.progress import NULL_PROGRESS

        return NULL_PROGRESS.task(description, total)


def test_interrupted_run_stays_incomplete(small_models, tmp_path):
    config = parse_pipeline(_onnx_pipeline(small_models), tmp_path / "p.toml")
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(config, runs_dir=tmp_path / "runs", run_id="cut", progress=_Interrupt())
    path = tmp_path / "runs" / "cut"
    assert run_state(path) == "incomplete" and not (path / "manifest.json").exists()
    assert json.loads((path / RUNNING_NAME).read_text())["stage"] == "quantize"
    from qconsist.errors import RunStoreError

    with pytest.raises(RunStoreError, match=r"run .*cut is incomplete \(started .*, last step quantize\)"):
        open_run(path)


def test_killed_cli_run_is_recognised_as_incomplete(small_models, tmp_path):
    """SIGKILL a real ``qconsist pipeline run`` mid-way: no manifest, RUNNING.json says where it stopped."""
    import signal
    import subprocess
    import sys
    import time

    pipeline = tmp_path / "long.toml"
    pipeline.write_text(
        f'[model]\nonnx = "{small_models["classifier"]}"\n'
        f'[calibration]\ndata = "{small_models["arrays"]}"\nrepeat = 100\n'
    )
    runs = tmp_path / "runs"
    command = [str(Path(sys.executable).parent / "qconsist"), "pipeline", "run", str(pipeline), "--runs-dir", str(runs), "--run-id", "killed"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = runs / "killed" / RUNNING_NAME
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (marker.exists() and "calib_repeat" in marker.read_text()):
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    assert run_state(runs / "killed") == "incomplete"
    assert not (runs / "killed" / "manifest.json").exists()
    assert json.loads(marker.read_text())["stage"] == "calib_repeat"
