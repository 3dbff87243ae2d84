"""``qconsist pipeline run`` and ``qconsist calib repeat`` through typer's CliRunner."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from typer.testing import CliRunner

from qconsist.cli import app


def _write_pipeline(folder: Path, small_models, **extra) -> Path:
    text = (
        'name = "small"\n'
        f'[model]\nonnx = "{small_models["classifier"]}"\n'
        f'[calibration]\ndata = "{small_models["arrays"]}"\ncount = 8\nrepeat = 2\n'
        f'[evaluation]\ndata = "{small_models["arrays"]}"\noffset = 8\n'
    )
    for section, body in extra.items():
        text += f"[{section}]\n{body}\n"
    path = folder / "small.toml"
    path.write_text(text)
    return path


def test_pipeline_run_prints_artifacts_md5_and_verdict(small_models, tmp_path):
    pipeline = _write_pipeline(tmp_path, small_models, quantize="per_channel = true")
    result = CliRunner().invoke(app, ["pipeline", "run", str(pipeline), "--run-id", "small-cli"])
    assert result.exit_code == 0, result.output
    run = Path("runs") / "small-cli"
    lines = result.stdout.splitlines()
    assert lines[0] == f"run small-cli: {run}"
    for line, stage in zip(lines[1:4], ("convert", "optimize", "quantize")):
        md5 = hashlib.md5((run / stage / "model.onnx").read_bytes()).hexdigest()
        assert line.startswith(f"  {stage:<11} {stage}/model.onnx  md5 {md5}  (")
    assert lines[4].startswith("  check optimize: max abs diff ") and lines[4].endswith("(atol 1e-05, rtol 0.0001): passed")
    assert lines[5].startswith("  check quantize: max abs diff ") and lines[5].endswith("on 4 evaluation inputs: passed (floor 15 dB)")
    quant_md5 = hashlib.md5((run / "quantize" / "model.onnx").read_bytes()).hexdigest()
    assert lines[6] == f"calibration repeat: 2 calibrations agree: md5 {quant_md5}"


def test_pipeline_run_json(small_models, tmp_path):
    pipeline = _write_pipeline(tmp_path, small_models)
    result = CliRunner().invoke(app, ["pipeline", "run", str(pipeline), "--json", "--runs-dir", str(tmp_path / "elsewhere")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "qconsist.pipeline-result/1" and data["passed"] is True
    assert Path(data["path"]).parent == tmp_path / "elsewhere" and not Path("runs").exists()
    assert data["calib_repeat"]["agree"] is True and len(data["calib_repeat"]["runs"]) == 2


def test_calib_repeat_on_onnx_and_arrays(small_models):
    result = CliRunner().invoke(app, ["calib", "repeat", str(small_models["classifier"]), "--data", str(small_models["arrays"]), "-n", "3", "--per-channel"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    md5 = lines[0].split("md5 ")[1].split()[0]
    assert [line.split("md5 ")[1].split()[0] for line in lines[:3]] == [md5] * 3
    assert lines[3] == f"3 calibrations agree: md5 {md5}"


def test_calib_repeat_json_on_pipeline(small_models, tmp_path):
    pipeline = _write_pipeline(tmp_path, small_models)
    result = CliRunner().invoke(app, ["calib", "repeat", str(pipeline), "-n", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "qconsist.calib-repeat/1" and data["agree"] is True and data["params"]["count"] == 2
    assert not Path("runs").exists()  # calib repeat writes no run directory


def test_calib_repeat_errors(small_models):
    runner = CliRunner()
    result = runner.invoke(app, ["calib", "repeat", str(small_models["classifier"])])
    assert result.exit_code == 2
    assert result.stderr == f"error: {small_models['classifier']} is not a pipeline file (.toml): give --inputs with the calibration arrays\n"
    result = runner.invoke(app, ["calib", "repeat", str(small_models["classifier"]), "--data", str(small_models["arrays"]), "--method", "Median"])
    assert result.exit_code == 2
    assert result.stderr == "error: options: calibration.method must be one of MinMax, Entropy, Percentile, Distribution, got 'Median'\n"
    result = runner.invoke(app, ["calib", "repeat", str(small_models["classifier"]), "--data", str(small_models["arrays"]), "-n", "1"])
    assert result.exit_code == 2 and result.stderr == "error: --repeats must be between 2 and 100, got 1\n"


def test_disagreement_is_rendered_tensor_by_tensor(small_models, capsys):
    """A real disagreement (two calibration sets) as ``calib repeat`` prints it."""
    from qconsist.calibration.repeat import calibrate_each
    from qconsist.cli.calib import render_repeat
    from qconsist.inputs import open_input_set
    from qconsist.stages.quantize import CalibrationOptions, QuantizeOptions

    result = calibrate_each(
        small_models["classifier"], [open_input_set(small_models["arrays"]), open_input_set(small_models["arrays_b"])],
        QuantizeOptions(), CalibrationOptions(),
    )
    render_repeat(result)
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == f"2 calibrations disagree: 2 distinct md5s, {len({d.tensor for d in result.differences})} quantized tensor(s) differ"
    x = next(d for d in result.differences if d.tensor == "x")
    assert f"  {x.line()}" in lines
    assert x.line().startswith("run 2: activation 'x' (nodes conv): scale differs by up to ")
