"""Model descriptions and their fetcher.

A description (``models/<name>.toml`` in the source tree, shipped as package data too) says where a model's
files come from and their sha256. ``fetch_model`` downloads the source with pip (the only network qconsist
uses), extracts the named members, verifies every sha256 and caches the files in
``$QCONSIST_CACHE`` (default ``~/.cache/qconsist``)/models/<name>/. A cached file is re-verified on use.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from qconsist.errors import ConfigError, InputError, OutputError
from qconsist.tomlfile import read_toml

_SOURCE_TREE_MODELS = Path(__file__).resolve().parent.parent.parent / "models"


def cache_root() -> Path:
    return Path(os.environ.get("QCONSIST_CACHE", Path.home() / ".cache" / "qconsist"))


@dataclass(frozen=True)
class ModelFile:
    role: str
    member: str
    sha256: str


@dataclass(frozen=True)
class ModelDescription:
    name: str
    description: str
    format: str
    package: str
    version: str
    source_sha256: str
    files: tuple[ModelFile, ...]

    def file(self, role: str) -> ModelFile:
        for f in self.files:
            if f.role == role:
                return f
        raise ConfigError(f"model {self.name} has no file '{role}'")


def _description_paths() -> list[Path]:
    """``models/*.toml`` of the source tree (qconsist is installed editable), or of $QCONSIST_MODELS."""
    folder = Path(os.environ.get("QCONSIST_MODELS", _SOURCE_TREE_MODELS))
    return sorted(folder.glob("*.toml")) if folder.is_dir() else []


def _parse(path: Path) -> ModelDescription:
    try:
        data = read_toml(path, "model description", ConfigError)
        source = data["source"]
        if source.get("kind") != "pypi-sdist":
            raise ConfigError(f"{path}: source.kind must be 'pypi-sdist'")
        files = tuple(
            ModelFile(role=role, member=spec["member"], sha256=spec["sha256"]) for role, spec in data["files"].items()
        )
        return ModelDescription(
            name=data["name"], description=data.get("description", ""), format=data["format"],
            package=source["package"], version=source["version"], source_sha256=source["sha256"], files=files,
        )
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"model description {path} is invalid: {exc}") from None


def available_models() -> dict[str, Path]:
    return {p.stem: p for p in _description_paths()}


def find_model(name: str) -> ModelDescription:
    models = available_models()
    if name not in models:
        raise ConfigError(f"unknown model {name!r}; bundled models: {', '.join(sorted(models)) or 'none'}")
    return _parse(models[name])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _download_sdist(desc: ModelDescription, into: Path) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
        "-d", str(into), f"{desc.package}=={desc.version}",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"cannot download {desc.package}=={desc.version}: {exc}") from None
    archives = sorted(into.glob(f"{desc.package}-{desc.version}.tar.gz"))
    if not archives:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no archive"]
        raise InputError(f"cannot download {desc.package}=={desc.version} from the package index: {tail[0]}")
    archive = archives[0]
    if _sha256(archive) != desc.source_sha256:
        raise InputError(f"{archive.name}: sha256 differs from the one recorded in models/{desc.name}.toml")
    return archive


def fetch_model(name: str) -> dict[str, Path]:
    """Paths of the model's files in the cache, downloading and verifying them if needed."""
    desc = find_model(name)
    target = cache_root() / "models" / name
    paths = {f.role: target / Path(f.member).name for f in desc.files}
    if all(p.is_file() and _sha256(p) == f.sha256 for f, p in zip(desc.files, paths.values())):
        return paths
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create model cache {target}: {exc.strerror or exc}") from None
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        tmpdir = Path(tmp)
        archive = _download_sdist(desc, tmpdir)
        with tarfile.open(archive, "r:gz") as tar:
            for f in desc.files:
                try:
                    member = tar.getmember(f.member)
                except KeyError:
                    raise InputError(f"{archive.name} has no member {f.member}") from None
                source = tar.extractfile(member)
                if source is None:
                    raise InputError(f"{archive.name}: {f.member} is not a regular file")
                staged = tmpdir / (Path(f.member).name + ".part")
                with source, open(staged, "wb") as out:
                    shutil.copyfileobj(source, out)
                if _sha256(staged) != f.sha256:
                    raise InputError(f"{f.member}: sha256 differs from models/{name}.toml")
                os.replace(staged, paths[f.role])
    return paths
