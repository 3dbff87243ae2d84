"""The README's "Your own model" pipeline files run as written (issue 19, item 6): the ONNX detector on a real
YOLOX-style export (ddddocr's, opset 11) and the Caffe classifier on open_nsfw, each beside folders of real
photographs named as the files name them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from qconsist.inputs.photos import package_photos
from qconsist.models import fetch_model
from qconsist.pipeline.config import load_pipeline
from qconsist.pipeline.runner import run_pipeline

pytestmark = pytest.mark.slow
README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def _quick_start() -> str:
    return README.split("## Your own model", 1)[1].split("\n## ", 1)[0]


def _pipeline_files() -> dict[str, str]:
    blocks = re.findall(r"```toml\n(.*?)```", _quick_start(), re.S)
    files = {re.search(r'^name = "(\w+)"', b, re.M).group(1): b for b in blocks if "[model]" in b}
    assert set(files) == {"detector", "classifier"}
    return files


def _folder(tmp_path: Path, files: dict[str, Path]) -> Path:
    photos = package_photos()
    for name, chosen in (("calibration", photos[:8]), ("evaluation", photos[12:15])):
        (tmp_path / name).mkdir()
        for photo in chosen:
            shutil.copyfile(photo, tmp_path / name / photo.name)
    for name, source in files.items():
        shutil.copyfile(source, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("name", ["detector", "classifier"])
def test_the_quick_start_pipeline_files_run(tmp_path, name):
    text = _pipeline_files()[name]
    if name == "detector":
        folder = _folder(tmp_path, {"detector.onnx": fetch_model("ddddocr_det")["onnx"]})
    else:
        nsfw = fetch_model("open_nsfw")
        folder = _folder(tmp_path, {"deploy.prototxt": nsfw["prototxt"], "weights.caffemodel": nsfw["caffemodel"]})
    (folder / f"{name}.toml").write_text(text)
    result = run_pipeline(load_pipeline(folder / f"{name}.toml"), runs_dir=folder / "runs")
    assert set(result.artifacts) == {"convert", "optimize", "quantize"}
    assert result.repeat is not None and result.repeat.agree


def test_the_quick_start_declares_output_kinds():
    section = _quick_start()
    assert 'outputs = { output = "regression" }' in section
    for kind in ("class-scores", "regression", "map"):
        assert f"`{kind}`" in section
    assert "samples stacked on axis 0" in section
