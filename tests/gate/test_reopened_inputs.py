"""What the gate judges it verifies first: the evaluation set it reopens from the recorded configuration must be
the one the pipeline run recorded (its digest); a set changed on disk since is an error naming the samples
removed, added and changed, never a verdict "on 3 samples" (issue 29, item 2)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from onnx_builders import build_classifier_model
from qconsist.cli import app

runner = CliRunner()


def _images(folder, names, seed):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in names:
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(folder / name)
    return folder


@pytest.fixture()
def pipeline_run(tmp_path):
    model = build_classifier_model(tmp_path / "classifier.onnx")
    calibration = _images(tmp_path / "calibration", [f"c{i}.png" for i in range(6)], seed=1)
    evaluation = _images(tmp_path / "evaluation", [f"e{i}.png" for i in range(4)], seed=2)
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'name = "tiny"\n[model]\nonnx = "{model}"\n[preprocess]\nresize = [8, 8]\n'
                        f'[calibration]\ndata = "{calibration}"\n[evaluation]\ndata = "{evaluation}"\n')
    result = runner.invoke(app, ["pipeline", "run", str(pipeline), "--runs-dir", str(tmp_path / "runs"), "--run-id", "p"])
    assert result.exit_code == 0, result.output
    return {"run": tmp_path / "runs" / "p", "evaluation": evaluation, "calibration": calibration}


def _gate(run):
    return runner.invoke(app, ["gate", str(run)])


def _refused(result, run, evaluation, recorded, now, detail):
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    assert result.stderr == (f"error: run {run}: its evaluation set {evaluation} is not the one the run recorded ({recorded} "
                             f"samples recorded, {now} now): {detail}; restore it or run the pipeline again\n")


def test_the_gate_judges_the_recorded_evaluation_set(pipeline_run):
    result = _gate(pipeline_run["run"])  # fails only its calibration.repeat check (no repeated calibration)
    assert (result.exit_code, result.stderr) == (1, ""), result.output
    assert "PASS           inference.repeat: two fresh sessions gave bit-identical final outputs on 4 samples" in result.stdout


def test_a_deleted_evaluation_image_is_named(pipeline_run):
    (pipeline_run["evaluation"] / "e2.png").unlink()
    _refused(_gate(pipeline_run["run"]), pipeline_run["run"], pipeline_run["evaluation"], 4, 3, "removed e2.png")


def test_an_evaluation_set_replaced_by_the_calibration_images_is_named(pipeline_run):
    shutil.rmtree(pipeline_run["evaluation"])
    shutil.copytree(pipeline_run["calibration"], pipeline_run["evaluation"])
    _refused(_gate(pipeline_run["run"]), pipeline_run["run"], pipeline_run["evaluation"], 4, 6,
             "removed e0.png, e1.png, e2.png, e3.png; added c0.png, c1.png, c2.png, c3.png, c4.png and 1 more")


def test_a_changed_evaluation_image_is_named(pipeline_run):
    _images(pipeline_run["evaluation"], ["e1.png"], seed=9)  # same name, other pixels
    _refused(_gate(pipeline_run["run"]), pipeline_run["run"], pipeline_run["evaluation"], 4, 4, "changed e1.png")
