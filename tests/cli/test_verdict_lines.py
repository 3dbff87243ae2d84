"""The verdict: the last line of every command that judges says PASS or FAIL (as Polygraphy ends each command);
the quantize check says whether it passed its floor, as the optimize check does; a pipeline run says what to run
next."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnx_builders import build_classifier_model, save_arrays
from qconsist.cli import app

PIPELINE = ('name = "cls"\n[model]\nonnx = "cls.onnx"\n[calibration]\ndata = "arrays.npy"\ncount = 8\n{repeat}'
            '[evaluation]\ndata = "arrays.npy"\noffset = 8\n')


def _invoke(*args, code: int = 0):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == code, result.output
    return result.stdout.splitlines()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("verdicts")
    build_classifier_model(folder / "cls.onnx")
    save_arrays(folder / "arrays.npy", 12, seed=2)
    (folder / "once.toml").write_text(PIPELINE.format(repeat=""))
    (folder / "twice.toml").write_text(PIPELINE.format(repeat="repeat = 2\n"))
    return folder


def test_pipeline_run_ends_with_its_verdict_and_what_to_run_next(folder):
    lines = _invoke("pipeline", "run", folder / "twice.toml", "--runs-dir", folder / "runs", "--run-id", "twice")
    run = folder / "runs" / "twice"
    assert lines[4].endswith("(atol 1e-05, rtol 0.0001): passed")
    assert lines[5].endswith("top-1 agreement 100% on 4 evaluation inputs: passed (floor 15 dB)")
    assert lines[-5:] == [
        "next:",
        f"  qconsist report {run} -o twice.html  # the run's page",
        f"  qconsist quant-error {run}  # where quantization loses, node by node",
        f"  qconsist gate {run} --baseline RUN  # judged against an earlier run",
        "PASS cls: 4 checks passed; 2 calibrations agree (run twice)",
    ]


def test_a_quantize_check_without_a_floor_says_it_only_recorded(folder):
    (folder / "off.toml").write_text(PIPELINE.format(repeat="") + '[quantize]\nmin_sqnr_db = "off"\n')
    lines = _invoke("pipeline", "run", folder / "off.toml", "--runs-dir", folder / "runs", "--run-id", "off")
    assert lines[5].endswith('on 4 evaluation inputs: recorded (no floor: [quantize] min_sqnr_db = "off")')
    assert lines[-1] == "PASS cls: 3 checks passed (run off)"


def test_gate_calib_repeat_and_diff_end_with_pass_or_fail(folder):
    runs = folder / "runs"
    for name in ("once-a", "once-b"):
        _invoke("pipeline", "run", folder / "once.toml", "--runs-dir", runs, "--run-id", name)
    assert _invoke("gate", runs / "once-b", "--baseline", runs / "once-a", code=1)[-1] == \
        "FAIL cls: 1 check(s) failed: calibration.repeat"
    _invoke("pipeline", "run", folder / "twice.toml", "--runs-dir", runs, "--run-id", "twice-b")
    if not (runs / "twice").is_dir():
        _invoke("pipeline", "run", folder / "twice.toml", "--runs-dir", runs, "--run-id", "twice")
    assert _invoke("gate", runs / "twice-b", "--baseline", runs / "twice")[-1] == "PASS cls: 8 checks passed, 2 not applicable"
    assert _invoke("calib", "repeat", folder / "once.toml", "-n", "2")[-1] == "PASS: 2 calibrations agree"
    assert _invoke("diff", runs / "once-a", runs / "once-b")[-1] == "PASS — verdict: identical"
    (folder / "other.toml").write_text(PIPELINE.format(repeat="").replace("count = 8", "count = 5"))
    _invoke("pipeline", "run", folder / "other.toml", "--runs-dir", runs, "--run-id", "other")
    assert _invoke("diff", runs / "once-a", runs / "other", code=1)[-1] == "FAIL — verdict: diverged"


def test_changed_parameters_say_from_what_to_what(folder):
    runs = folder / "runs"
    for name, toml in (("base-8", "once.toml"), ("count-5", "other.toml")):
        if not (folder / toml).is_file():
            (folder / toml).write_text(PIPELINE.format(repeat="").replace("count = 8", "count = 5"))
        _invoke("pipeline", "run", folder / toml, "--runs-dir", runs, "--run-id", name)
    lines = _invoke("gate", runs / "count-5", "--baseline", runs / "base-8", code=1)
    artifacts = next(line for line in lines if line.startswith("  FAIL           artifacts: "))
    assert "parameters changed: calibration_count 8 → 5, calibration inputs (digest differs))" in artifacts


def test_a_night_ends_with_its_verdict_and_says_a_shared_reason_once(tmp_path):
    from nightly_files import convnet_nightly

    config = convnet_nightly(tmp_path, percentile=True)
    lines = _invoke("nightly", config)
    skipped = [line for line in lines if "locate skipped" in line]
    assert len(skipped) == 1 and skipped[0].startswith("locate skipped for 2 entries: ")
    assert lines[-1].startswith("PASS night nightly-") and lines[-1].endswith(": 2 entries passed")


def test_a_bundled_model_not_cached_yet_is_said_to_be_downloaded(tmp_path, monkeypatch):
    """pipeline run says before it downloads a bundled model (once), and after where it put it."""
    from qconsist.cli.pipeline import _uncached_model
    from qconsist.models.registry import fetch_model
    from qconsist.pipeline.config import load_pipeline

    config = load_pipeline(Path(__file__).resolve().parents[2] / "pipelines" / "open_nsfw.toml")
    fetch_model("open_nsfw")
    assert _uncached_model(config) is None  # the shared cache holds it
    monkeypatch.setenv("QCONSIST_CACHE", str(tmp_path / "empty-cache"))
    assert _uncached_model(config) == "open_nsfw"  # a fresh machine: the run downloads it first
