"""Issue 19's input-side hostile cases, each through the CLI: a model with a dynamic height and width given images
of no declared size (or a size it cannot take), file and folder names that are not UTF-8, an image enlarged
hundreds of times. Exit 2 and one exact line where refused; read and written correctly where not."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image
from typer.testing import CliRunner

from onnx_builders import build_classifier_model, build_unet_model
from photo_files import photo
from qconsist.cli import app
from qconsist.inputs.record import read_samples
from qconsist.store.rundir import open_run


def _invoke(*args) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def _error(result, message: str, code: int = 2) -> None:
    assert result.exit_code == code, result.output
    assert result.stderr == f"error: {message}\n"
    assert "Traceback" not in result.output


def _nothing_left() -> None:
    runs = Path("runs")
    assert not runs.exists() or list(runs.iterdir()) == [], f"left behind: {list(runs.iterdir())}"


def _pipeline(folder: Path, model: Path, data: Path, preprocess: str) -> Path:
    path = folder / "p.toml"
    path.write_text(f'[model]\nonnx = "{model}"\n[preprocess]\n{preprocess}\n[calibration]\ndata = "{data}"\n')
    return path


@pytest.fixture()
def photos(tmp_path):
    folder = tmp_path / "photos"
    for n in range(3):
        photo(folder / f"{n}.jpg", n, (50, 40))
    return folder


def test_the_unet_crashes_onnxruntime_off_its_multiple(tmp_path):
    """Why the refusals below are needed: off a multiple of 4 the model fails inside onnxruntime."""
    session = ort.InferenceSession(str(build_unet_model(tmp_path / "unet.onnx")), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.zeros((1, 3, 32, 32), np.float32)})[0].shape == (1, 4, 32, 32)
    with pytest.raises(Exception, match=r"Add node. Name:'merge1'"):
        session.run(None, {"x": np.zeros((1, 3, 30, 30), np.float32)})


@pytest.mark.parametrize("command", ["run", "pipeline"])
def test_dynamic_height_and_width_without_resize(tmp_path, photos, command):
    model = build_unet_model(tmp_path / "unet.onnx")
    pipeline = _pipeline(tmp_path, model, photos, 'channel_order = "RGB"')
    args = ["run", model, "--inputs", photos, "--pipeline", pipeline] if command == "run" else ["pipeline", "run", pipeline]
    _error(_invoke(*args), "input x has dynamic height and width: declare [preprocess] resize (the model takes multiples of 4)")
    _nothing_left()


def test_dynamic_height_and_width_of_a_model_that_says_no_multiple(tmp_path, photos):
    model = build_unet_model(tmp_path / "gap.onnx", upsample=False)
    pipeline = _pipeline(tmp_path, model, photos, 'channel_order = "RGB"')
    _error(_invoke("run", model, "--inputs", photos, "--pipeline", pipeline),
           "input x has dynamic height and width: declare [preprocess] resize")
    pipeline.write_text(pipeline.read_text().replace('channel_order = "RGB"', "resize = [30, 30]"))
    assert _invoke("run", model, "--inputs", photos, "--pipeline", pipeline).exit_code == 0  # any size it takes


@pytest.mark.parametrize("command", ["run", "pipeline"])
def test_a_size_the_model_cannot_take(tmp_path, photos, command):
    model = build_unet_model(tmp_path / "unet.onnx")
    pipeline = _pipeline(tmp_path, model, photos, "resize = [30, 32]")
    args = ["run", model, "--inputs", photos, "--pipeline", pipeline] if command == "run" else ["pipeline", "run", pipeline]
    _error(_invoke(*args), "input x takes heights and widths that are multiples of 4: [preprocess] resize [30, 32] is not; "
                           "declare multiples of 4")
    _nothing_left()
    pipeline.write_text(pipeline.read_text().replace("resize = [30, 32]", "resize = [40, 40]\ncrop = [32, 30]"))
    _error(_invoke(*args), "input x takes heights and widths that are multiples of 4: [preprocess] crop [32, 30] is not; "
                           "declare multiples of 4")
    pipeline.write_text(pipeline.read_text().replace("crop = [32, 30]", "crop = [32, 28]"))
    result = _invoke(*args)
    assert result.exit_code == 0, result.output


def test_an_image_enlarged_more_than_eight_times_is_refused(tmp_path):
    folder = tmp_path / "tiny"
    folder.mkdir()
    Image.new("RGB", (1, 1), (10, 20, 30)).save(folder / "dot.png")
    model = build_classifier_model(tmp_path / "m.onnx")
    pipeline = _pipeline(tmp_path, model, folder, "resize = [8, 8]")
    assert _invoke("run", model, "--inputs", folder, "--pipeline", pipeline).exit_code == 0  # 8 times: allowed
    pipeline.write_text(pipeline.read_text().replace("resize = [8, 8]", "resize = [9, 8]\ncrop = [8, 8]"))
    _error(_invoke("run", model, "--inputs", folder, "--pipeline", pipeline, "--run-id", "dot"),
           f"image {folder / 'dot.png'} is 1x1: resizing it to 8x9 would enlarge it 9 times, more than 8; remove it, or "
           "enlarge it yourself if it is meant")
    assert not Path("runs/dot").exists()


def test_names_that_are_not_utf8_are_read_and_written(tmp_path):
    """A folder and an image whose names are not UTF-8: run, diff, inspect and the sample table keep the bytes."""
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    odd = photo(folder / os.fsdecode(b"\xff\xfe.jpg"), 0)
    photo(folder / "ok.jpg", 1)
    model = build_classifier_model(tmp_path / "m.onnx")
    pipeline = _pipeline(tmp_path, model, tmp_path, "resize = [8, 8]")  # a TOML file holds UTF-8: the set comes by --inputs
    for run_id, workers in (("a", "0"), ("b", "2")):
        result = _invoke("run", model, "--inputs", folder, "--pipeline", pipeline, "--run-id", run_id, "--workers", workers)
        assert result.exit_code == 0, result.output
    manifest = open_run(Path("runs/a"))
    assert manifest.inputs["source"] == str(folder)
    assert "\\udce9" in Path("runs/a/manifest.json").read_text(encoding="utf-8")  # valid UTF-8: the byte escaped
    table = read_samples(Path("runs/a"), manifest, manifest.inputs)
    assert [os.fsencode(n) for n in table.names] == [b"ok.jpg", b"\xff\xfe.jpg"]
    assert table.names[1] == odd.name
    result = _invoke("diff", "runs/a", "runs/b")
    assert result.exit_code == 0 and "verdict: identical" in result.stdout
    shown = _invoke("inspect", "runs/a")
    assert shown.exit_code == 0 and os.fsencode(str(folder)) in shown.stdout_bytes
    single = _invoke("run", model, "--inputs", odd, "--pipeline", pipeline, "--run-id", "c", "--json")
    assert single.exit_code == 0 and json.loads(single.stdout)["samples"] == 1
