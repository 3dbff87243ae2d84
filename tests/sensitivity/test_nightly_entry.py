"""The nightly's ``sensitivity`` entry option: a regression arrives with its candidate fix. A map head whose int8
quantization is destroyed fails its gate; with ``sensitivity = {target = "sqnr>=20"}`` the entry also holds a
verified fix (16-bit activations), shown in the terminal summary, the entry's record and its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from output_models import build_outlier_map_model, save_map_inputs
from qconsist.cli import app
from qconsist.errors import ConfigError
from qconsist.nightly.config import SensitivityWhen, load_nightly


def _nightly(folder: Path, sensitivity: str) -> Path:
    model, data = build_outlier_map_model(folder / "map.onnx"), save_map_inputs(folder / "x.npy")
    path = folder / "nightly.toml"
    path.write_text(f'runs_dir = "runs"\n[[models]]\nname = "map"\nlocate = false\n{sensitivity}\n'
                    f'[models.pipeline]\n[models.pipeline.model]\nonnx = "{model}"\n[models.pipeline.calibration]\n'
                    f'data = "{data}"\nrepeat = 2\n[models.pipeline.evaluation]\noutputs = {{map = "map"}}\n')
    return path


def test_a_failing_entry_comes_with_its_verified_fix(tmp_path):
    path = _nightly(tmp_path, 'sensitivity = {target = "sqnr>=20", candidates = 2}')
    result = CliRunner().invoke(app, ["nightly", str(path)])
    assert result.exit_code == 1, result.output  # the gate still fails: the fix is a candidate, not applied
    lines = result.stdout.splitlines()
    fix = next(line for line in lines if "candidate fix" in line)
    assert fix.startswith("        candidate fix, verified for sqnr>=20 (run map-sensitivity-") and fix.endswith(
        '): activation_type = "int16"')
    entry_run = next(p for p in (tmp_path / "runs").iterdir() if p.name.startswith("map-entry-"))
    record = json.loads((entry_run / "manifest.json").read_text())["sections"]["nightly_entry"]["sensitivity"]
    assert record["passed"] is True and record["targets"] == ["sqnr>=20"]
    assert record["quantize_changes"] == {"activation_type": "int16"} and record["proposal"] == []
    assert record["lines"] == ["[quantize]", 'activation_type = "int16"']
    sensitivity_run = tmp_path / "runs" / record["run"]
    assert json.loads((sensitivity_run / "manifest.json").read_text())["kind"] == "sensitivity"
    html = (entry_run / "report.html").read_text()
    assert "Sensitivity: which nodes to keep in float" in html and "activation_type = &quot;int16&quot;" in html
    summary = json.loads(next((tmp_path / "runs").glob("nightly-*/summary.json")).read_text())
    assert summary["entries"][0]["sensitivity"]["run"] == record["run"]


def test_a_passing_entry_makes_no_sensitivity_run_unless_always(tmp_path):
    path = _nightly(tmp_path, 'sensitivity = {target = "sqnr>=20", when = "always"}\nset = {quantize = {activation_type = "int16"}}')
    config = load_nightly(path)
    assert config.models[0].sensitivity.when is SensitivityWhen.ALWAYS
    result = CliRunner().invoke(app, ["nightly", str(path), "--json"])
    assert result.exit_code == 0, result.output
    entry = json.loads(result.stdout)["entries"][0]
    assert entry["status"] == "pass" and entry["sensitivity"]["passed"] is True
    assert entry["sensitivity"]["proposal"] == [] and entry["sensitivity"]["lines"] == ["[quantize]"]


@pytest.mark.parametrize("value, message", [
    ('"sqnr>=20"', 'sensitivity must be a table such as {target = "sqnr>=40"}, got \'sqnr>=20\''),
    ("{}", "sensitivity: target must be a target or a list of them, e.g. \"sqnr>=40\", got None"),
    ('{target = "sqnr>=20", budget = 3}', "sensitivity: unknown key 'budget' (known: all, alternatives, candidates, target, when, widen)"),
    ('{target = "sqnr<=20"}', "sensitivity: target 'sqnr<=20': sqnr takes a lower bound: write sqnr>=20"),
    ('{target = "sqnr>=20", when = "sometimes"}', "sensitivity: 'when' must be \"fail\" or \"always\", got 'sometimes'"),
    ('{target = "sqnr>=20", candidates = 0}', "sensitivity: 'candidates' must be an integer >= 1, got 0"),
    ('{target = "sqnr>=20", all = "yes"}', "sensitivity: 'all' must be true or false, got 'yes'"),
])
def test_bad_sensitivity_options_are_one_line(tmp_path, value, message):
    path = _nightly(tmp_path, f"sensitivity = {value}")
    with pytest.raises(ConfigError) as raised:
        load_nightly(path)
    assert raised.value.message == f"{path}: model 'map': {message}"
