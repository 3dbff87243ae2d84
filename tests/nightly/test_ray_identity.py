"""The Ray executor for real (a local Ray started by `qconsist nightly --executor ray` in this process, on
this machine's 2 CPUs) over a nightly file derived from the bundled pipelines/nightly.toml: the history, the
run directories and the report are those of the local executor, in content (same hashes, same verdicts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nightly_files import derived_nightly
from qconsist.cli import app
from qconsist.store.rundir import run_state
from run_content import _text, night_content, run_content

# The Caffe-born open_nsfw, the FCN head and its determinized twin: every kind of entry of the bundled file
# (nudenet-320n and the Percentile twin add a minute and nothing new to what is compared).
MODELS = ["open_nsfw-minmax", "fcn_head", "fcn_head-determinized"]


@pytest.fixture(scope="module")
def nights(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray-identity")
    config = derived_nightly(folder, MODELS)
    runner = CliRunner()
    results = {}
    for executor in ("local", "ray"):
        runs = folder / f"runs-{executor}"
        results[executor] = (runs, runner.invoke(app, ["nightly", str(config), "--executor", executor, "--runs-dir", str(runs), "--json"]))
    return results


def test_both_executors_pass_every_entry(nights):
    for executor, (_, result) in nights.items():
        assert result.exit_code == 0, (executor, result.output)
        data = json.loads(result.stdout)
        assert data["executor"] == executor
        assert [e["model"] for e in data["entries"]] == MODELS
        assert [e["status"] for e in data["entries"]] == ["pass"] * 3
        assert data["retries"] == {}


def test_history_and_run_directories_are_identical_in_content(nights):
    (local_runs, local), (ray_runs, ray) = nights["local"], nights["ray"]
    local_night, ray_night = json.loads(local.stdout)["night_id"], json.loads(ray.stdout)["night_id"]
    expected = night_content(local_runs / "history.sqlite", local_night, local_runs)
    actual = night_content(ray_runs / "history.sqlite", ray_night, ray_runs)
    assert sorted(actual) == sorted(MODELS)
    for model in MODELS:
        assert set(expected[model]["runs"]) == {"entry", "pipeline", "quantized", "repeat"}
        assert expected[model]["hashes"]["quantize"]["md5"]  # hashes recorded, and below: equal
        assert actual[model]["hashes"] == expected[model]["hashes"], model
        assert actual[model]["verdict"] == expected[model]["verdict"], model
        assert expected[model]["figures"] and actual[model]["figures"] == expected[model]["figures"], model  # the night's figures
        for role, files in expected[model]["runs"].items():
            assert sorted(actual[model]["runs"][role]) == sorted(files), (model, role)
            for name, content in files.items():
                assert actual[model]["runs"][role][name] == content, (model, role, name)
    # every run directory of both nights is complete
    for runs in (local_runs, ray_runs):
        assert all(run_state(p) == "complete" for p in runs.iterdir() if p.is_dir())


def test_night_report_and_summary_are_identical_in_content(nights):
    (local_runs, local), (ray_runs, ray) = nights["local"], nights["ray"]
    local_night, ray_night = Path(json.loads(local.stdout)["path"]), Path(json.loads(ray.stdout)["path"])
    html = (ray_night / "report.html").read_text()
    assert "<th>GPU type</th>" in html and html.count("<td>none (CPU)</td>") == 3
    assert _text(html, ray_runs) == _text((local_night / "report.html").read_text(), local_runs)
    # the executor, and the order it handed the tasks out in (Ray: longest first; local: the file's), differ
    summary = {k: v for k, v in run_content(ray_night, ray_runs)["summary.json"].items() if k not in ("executor", "handout")}
    expected = {k: v for k, v in run_content(local_night, local_runs)["summary.json"].items() if k not in ("executor", "handout")}
    assert summary == expected
    # each entry says on which GPU it ran (none here: no GPU), and both nights record their wall time
    for runs, night in ((local_runs, local_night), (ray_runs, ray_night)):
        data = run_content(night, runs)["summary.json"]
        assert [e["devices"] for e in data["entries"]] == [[]] * 3
        recorded = json.loads((night / "summary.json").read_text())
        assert 0 < max(e["seconds"] for e in recorded["entries"]) <= recorded["seconds"]
        assert "Wall time of the night: " in (night / "report.html").read_text()
