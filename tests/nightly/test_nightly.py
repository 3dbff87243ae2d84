"""The issue's done-when scenario, automated: a nightly over open_nsfw (two calibration methods) and the
ONNX-born NudeNet 320n shipped in the nudenet wheel (models/nudenet_320n.toml); then one input changes and the second night's gate
fails naming the changed stage and the first diverging node; the report shows it; history has both nights.
Small input counts keep it near two minutes on two cores."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from browser import screenshot

from qconsist.cli import app
from qconsist.history import History, model_timeline
from qconsist.inputs.photos import package_photos
from qconsist.store.rundir import run_state

ROOT = Path(__file__).resolve().parents[2]
MODELS = ["open_nsfw-minmax", "open_nsfw-percentile", "nudenet-320n"]


def nightly_file(folder: Path) -> Path:
    """pipelines/nightly.toml's three models on a folder of photographs, with small counts."""
    photos = folder / "photos"
    photos.mkdir()
    for index, path in enumerate(package_photos()[:14]):
        shutil.copy(path, photos / f"{index:02d}_{path.name}")
    small = (
        '[models.set.calibration]\ndata = "photos"\ncount = 3\nrepeat = 2\n{method}'
        '[models.set.evaluation]\ndata = "photos"\noffset = 12\ncount = 2\n'
    )
    text = (
        f'runs_dir = "runs"\npolicy = "{ROOT / "policies" / "default.toml"}"\n'
        f'[[models]]\nname = "open_nsfw-minmax"\npipeline = "{ROOT / "pipelines" / "open_nsfw.toml"}"\n'
        + small.format(method='method = "MinMax"\n')
        + f'[[models]]\nname = "open_nsfw-percentile"\npipeline = "{ROOT / "pipelines" / "open_nsfw.toml"}"\n'
        + small.format(method='method = "Percentile"\npercentile = 99.99\n')
        + f'[[models]]\nname = "nudenet-320n"\npolicy = "{ROOT / "policies" / "detector.toml"}"\n'
        '[models.pipeline.model]\nsource = "nudenet_320n"\n'
        '[models.pipeline.preprocess]\nresize = [320, 320]\nchannel_order = "RGB"\npixel_range = 1.0\n'
        '[models.pipeline.calibration]\ndata = "photos"\ncount = 3\nrepeat = 2\n'
        '[models.pipeline.quantize]\nper_channel = true\nactivation_type = "int16"\nweight_type = "int16"\n'
        '[models.pipeline.evaluation]\ndata = "photos"\noffset = 12\ncount = 2\n'
    )
    path = folder / "nightly.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def two_nights(tmp_path_factory):
    folder = tmp_path_factory.mktemp("done-when")
    config = nightly_file(folder)
    runner = CliRunner()
    first = runner.invoke(app, ["nightly", str(config), "--json"])
    changed = folder / "photos" / "01_chelsea.png"  # a calibration photograph (calibration uses photos 0..2)
    Image.open(changed).transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(changed)
    second = runner.invoke(app, ["nightly", str(config), "--json"])
    return folder, first, second


def test_first_night_passes(two_nights):
    _, first, _ = two_nights
    assert first.exit_code == 0, first.output
    data = json.loads(first.stdout)
    assert [e["model"] for e in data["entries"]] == MODELS
    assert [e["status"] for e in data["entries"]] == ["pass"] * 3
    for entry in data["entries"]:
        assert entry["locate_skipped"].startswith("execution provider cuda (CUDAExecutionProvider) is not in this onnxruntime")  # recorded, not silent
        checks = {c["name"]: c for c in entry["verdict"]["checks"]}
        assert checks["artifacts"]["status"] == "not_applicable"  # first night: no baseline
        assert checks["calibration.repeat"]["status"] == "pass"
        assert checks["inference.repeat"]["status"] == "pass"
        assert checks["inference.repeat"]["message"].startswith("two dumped inferences are bit-identical in all ")


def test_second_night_fails_naming_stage_and_first_diverging_node(two_nights):
    _, _, second = two_nights
    assert second.exit_code == 1, second.output
    data = json.loads(second.stdout)
    for entry in data["entries"]:
        verdict = entry["verdict"]
        assert entry["status"] == "fail", entry["model"]
        assert entry["baseline"] is not None and entry["baseline_night"] is not None
        assert verdict["changed_stages"] == ["quantize"], entry["model"]  # convert and optimize did not change
        first = verdict["first_diverging_node"]
        assert first and first == verdict["diff"]["tensors"]["first"]
        reasons = "\n".join(verdict["reasons"])
        assert "artifacts: stage 'quantize' changed (md5 " in reasons
        assert "calibration inputs (digest differs)" in reasons
        assert f"the evaluation dumps first diverge at node {first} (origin nodes: " in reasons


def test_report_shows_the_failure_in_a_browser(two_nights, tmp_path):
    _, _, second = two_nights
    night = Path(json.loads(second.stdout)["path"])
    html = (night / "report.html").read_text()
    for model in MODELS:
        assert f'id="model-{model}"' in html
    # each model's reason once: its failed check named in the reasons line, its text in the check's row
    assert html.count("stage &#x27;quantize&#x27; changed (md5") == 3
    assert html.count("Divergence starts at <code>") == 3
    pixels = screenshot(night / "report.html", night / "report.png", tmp_path, size="1280,1600").astype(int)
    red = (np.abs(pixels - [198, 40, 40]).max(axis=-1) <= 12)
    assert red[5:50].mean() > 0.75 and pixels.std() > 10  # FAIL banner, page not blank


def test_history_shows_both_nights(two_nights):
    folder, first, second = two_nights
    nights = [json.loads(r.stdout)["night_id"] for r in (first, second)]
    db = History(folder / "runs" / "history.sqlite")
    for model in MODELS:
        timeline = model_timeline(db, model)
        assert [n["night_id"] for n in timeline.nights] == nights
        change = timeline.first_change("hash", "quantize")
        assert change.night_id == nights[1] and change.previous_night == nights[0]
        assert timeline.first_change("verdict").new == "fail"
        assert timeline.first_change("hash", "convert") is None
        assert timeline.first_change("hash", "optimize") is None
    result = CliRunner().invoke(app, ["history", "open_nsfw-minmax", "--db", str(folder / "runs" / "history.sqlite")])
    assert result.exit_code == 0, result.output
    assert f"{nights[1]}: stage 'quantize' md5 " in result.output
    assert f"{nights[1]}: verdict pass -> fail (was {nights[0]}); environment unchanged" in result.output
    page = (folder / "runs" / "history.html").read_text()  # the history page, written after each night
    for model in MODELS:
        assert f'<section data-model="{model}"' in page
    assert page.count('<td class="md5-changed">') == 3  # each model's quantized md5 changed on the second night
    for night in (first, second):
        report = (Path(json.loads(night.stdout)["path"]) / "report.html").read_text()
        assert '<a href="../history.html">the history page</a>' in report
    runs = [p for p in (folder / "runs").iterdir() if p.is_dir()]
    assert all(run_state(p) == "complete" for p in runs)
