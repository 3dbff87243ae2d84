"""Listings (issue 30): ``runs list`` names the models a night ran (not "?"), shows each run's verdict beside its
status (a pipeline whose quantize check failed is ``complete`` — its files are all there — and ``FAIL (check
quantize)``), ``inspect`` says the same, and a command given a folder of runs says so and names runs to give."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from output_models import build_outlier_map_model, save_map_inputs
from qconsist.cli import app
from qconsist.nightly.entry import EntryOutcome
from qconsist.nightly.runner import NIGHT_KIND, NightlyResult
from qconsist.store.manifest import Manifest
from qconsist.store.rundir import RunDirectory

runner = CliRunner()


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def map_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("map")
    return {"model": build_outlier_map_model(folder / "map.onnx"), "data": save_map_inputs(folder / "x.npy")}


def _pipeline(folder: Path, made: dict, extra: str = "") -> Path:
    path = folder / "map.toml"
    path.write_text(f'name = "map"\n[model]\nonnx = "{made["model"]}"\n[calibration]\ndata = "{made["data"]}"\n'
                    f'[evaluation]\noutputs = {{map = "map"}}\n{extra}')
    return path


def _night(runs: Path, statuses: dict[str, str]) -> Path:
    """A night's run directory as ``run_nightly`` writes it: its ``nightly`` section holds the entries' outcomes."""
    night = RunDirectory.create(runs, "night", NIGHT_KIND, run_id="night")
    result = NightlyResult(night_id="night", path=night.path, config="nightly.toml",
                           entries=[EntryOutcome(model=name, status=status) for name, status in statuses.items()])
    return night.finish(Manifest(kind=NIGHT_KIND, sections={"nightly": result.to_json()}))


def test_failed_quantize_check_is_complete_with_a_fail_verdict(map_model, tmp_path):
    assert _invoke("pipeline", "run", _pipeline(tmp_path, map_model), "--run-id", "destroyed").exit_code == 1
    off = tmp_path / "off"
    off.mkdir()
    assert _invoke("pipeline", "run", _pipeline(off, map_model, '[quantize]\nmin_sqnr_db = "off"\n'), "--run-id", "off").exit_code == 0
    inference = _invoke("run", "runs/off", "--inputs", map_model["data"], "--run-id", "plain")
    assert inference.exit_code == 0, inference.output
    result = _invoke("runs", "list", "--json")
    assert result.exit_code == 0, result.stderr
    listed = {r["name"]: (r["kind"], r["model"], r["status"], r["verdict"]) for r in json.loads(result.stdout)["runs"]}
    assert listed == {"destroyed": ("pipeline", "map", "complete", "FAIL (check quantize)"),
                      "off": ("pipeline", "map", "complete", "PASS"),
                      "plain": ("inference", "map", "complete", "—")}
    text = _invoke("runs", "list").stdout.splitlines()
    assert text[0].split() == ["run", "kind", "model", "status", "verdict", "age", "size"]
    rows = {line.split()[0]: line for line in text[1:-1]}
    assert re.fullmatch(r"destroyed +pipeline +map +complete +FAIL \(check quantize\) +\d+[smhd] +[\d.]+ (B|KB|MB)", rows["destroyed"])
    assert re.fullmatch(r"off +pipeline +map +complete +PASS +\d+[smhd] +[\d.]+ (B|KB|MB)", rows["off"])
    assert re.fullmatch(r"plain +inference +map +complete +— +\d+[smhd] +[\d.]+ (B|KB|MB)", rows["plain"])
    assert len({line.index("complete") for line in text[1:-1]}) == 1  # the verdict column keeps the columns aligned
    shown = _invoke("runs", "show", "destroyed")
    assert shown.stdout.splitlines()[0].startswith("run runs/destroyed: pipeline run of map, complete, verdict FAIL "
                                                   "(check quantize), started ")
    inspected = _invoke("inspect", "runs/destroyed")
    assert inspected.exit_code == 0, inspected.output
    assert re.fullmatch(r"run runs/destroyed: pipeline, complete, verdict FAIL \(check quantize\), \S+ → \S+",
                        inspected.stdout.splitlines()[0]), inspected.stdout.splitlines()[0]
    assert json.loads(_invoke("inspect", "runs/off", "--json").stdout)["verdict"] == "PASS"
    assert re.fullmatch(r"run runs/plain: inference, complete, \S+ → \S+", _invoke("inspect", "runs/plain").stdout.splitlines()[0])


def test_a_night_lists_the_models_it_ran_and_its_verdict(tmp_path):
    runs = tmp_path / "runs"
    _night(runs, {"open_nsfw-minmax": "pass", "nudenet-320n": "fail", "open_nsfw-percentile": "pass"})
    listed = json.loads(_invoke("runs", "list", "--runs-dir", runs, "--json").stdout)["runs"]
    assert [(r["kind"], r["model"], r["status"]) for r in listed] == [
        ("nightly", "open_nsfw-minmax,nudenet-320n +1 more", "complete")]  # was "?"
    assert listed[0]["verdict"] == "FAIL (1 of 3 models)"
    other = tmp_path / "other"
    _night(other, {"open_nsfw-minmax": "pass"})
    text = _invoke("runs", "list", "--runs-dir", other).stdout.splitlines()
    assert re.fullmatch(r"night +nightly +open_nsfw-minmax +complete +PASS +\d+[smhd] +[\d.]+ (B|KB)", text[1]), text[1]


def test_a_folder_of_runs_is_not_an_interrupted_run():
    _night(Path("runs"), {"open_nsfw-minmax": "pass"})
    RunDirectory.create(Path("runs"), "stuck", "pipeline", run_id="stuck")  # incomplete: named after the complete one
    for given in ("runs", "runs/"):
        result = _invoke("quant-error", given)
        assert result.exit_code == 2
        assert result.stderr == "error: runs is a folder of 2 run(s), not a run; give one of them, e.g. runs/night or runs/stuck\n"
