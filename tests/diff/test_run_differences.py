"""``diff`` lists every difference between the two runs' artifacts, stages, batch sizes and re-stamping before any
tensor (issue 27 item 11): never "artifacts: identical" between a run of the optimize stage and a run of the
quantize stage, never silence on a batch size or a re-stamped model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from judge_models import identical_and_zero_branch
from onnx_builders import save_arrays
from qconsist.cli import app
from qconsist.pipeline.config import parse_pipeline
from qconsist.pipeline.runner import run_pipeline


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("differences")
    model, arrays = identical_and_zero_branch(folder / "branch.onnx"), save_arrays(folder / "arrays.npy", 4, seed=2)
    config = parse_pipeline({"name": "branch", "model": {"onnx": str(model)}, "calibration": {"data": str(arrays)},
                             "quantize": {"format": "QDQ", "op_types": ["Conv"]}}, folder / "pipeline.toml")
    pipeline = run_pipeline(config, runs_dir=folder / "runs", run_id="pipeline").path
    made = {}
    for run_id, extra in (("optimize", ["--stage", "optimize"]), ("quantize", ["--stage", "quantize"]),
                          ("quantize-b2", ["--stage", "quantize", "--batch-size", "2", "--dynamic-batch"])):
        out = CliRunner().invoke(app, ["run", str(pipeline), *extra, "--inputs", str(arrays), "--runs-dir",
                                       str(folder / "inference"), "--run-id", run_id])
        assert out.exit_code == 0, out.output
        made[run_id] = folder / "inference" / run_id
    out = CliRunner().invoke(app, ["run", str(pipeline / "quantize" / "model.onnx"), "--inputs", str(arrays),
                                   "--runs-dir", str(folder / "inference"), "--run-id", "file"])
    assert out.exit_code == 0, out.output
    made["file"] = folder / "inference" / "file"
    made["pipeline"] = pipeline
    return made



def test_an_optimize_stage_run_and_a_quantize_stage_run_differ_in_their_artifacts_first(runs, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    out = CliRunner().invoke(app, ["diff", str(runs["optimize"]), str(runs["quantize"])])
    assert out.exit_code == 1, out.output
    pipeline = runs["pipeline"]
    manifest = json.loads((pipeline / "manifest.json").read_text())
    md5 = {s["name"]: s["artifact"]["md5"][:12] for s in manifest["stages"]}
    assert out.stdout.splitlines()[2:6] == [
        "runs differ: stage: A ran the optimize stage's model, B the quantize stage's",
        f"runs differ: model: A ran {pipeline}/optimize/model.onnx (md5 {md5['optimize']}), B ran "
        f"{pipeline}/quantize/model.onnx (md5 {md5['quantize']})",
        "runs differ: stages: only B holds quantize",
        "artifacts: the stages both runs hold are identical; the runs ran different models (above)",
    ]
    assert "artifacts: identical" not in out.stdout


def test_a_batch_size_and_a_restamped_model_are_named(runs, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    out = CliRunner().invoke(app, ["diff", str(runs["quantize"]), str(runs["quantize-b2"])])
    assert out.exit_code == 0, out.output  # the same bits per sample: the verdict stays identical
    stamp = json.loads((runs["quantize-b2"] / "manifest.json").read_text())["model"]["dynamic_batch"]
    assert out.stdout.splitlines()[2:5] == [
        "runs differ: batch size: A 1, B 2",
        "runs differ: re-stamped: A ran its model as it is; B ran it re-stamped to take any batch size "
        f"(model/model.onnx, md5 {stamp['md5'][:12]})",
        "artifacts: identical",
    ]
    assert out.stdout.splitlines()[-1] == "PASS — verdict: identical"


def test_the_same_model_run_from_its_run_and_from_its_file_is_named_and_agrees(runs, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    out = CliRunner().invoke(app, ["diff", str(runs["quantize"]), str(runs["file"])])
    assert out.exit_code == 0, out.output  # the same bytes ran: the differences are named, the verdict holds
    assert out.stdout.splitlines()[2:5] == [
        "runs differ: stage: A ran the quantize stage's model, B a model file's",
        "runs differ: stages: only A holds convert, optimize, quantize; only B holds model",
        "artifacts: identical",
    ]
    assert out.stdout.splitlines()[-1] == "PASS — verdict: identical"
