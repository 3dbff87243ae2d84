"""Hashes of artifacts: file bytes (md5, sha256), model content, and per-initializer digests.

* ``md5`` / ``sha256`` of the file: what users' scripts compare; any byte change shows.
* ``content``: sha256 of a canonical form of the model that ignores non-semantic metadata (producer
  name and version, doc strings, the graph's name, the order of metadata entries, how an initializer's
  bytes are encoded),
  so "the bytes changed" can be told from "the model changed".
* per-initializer sha256 of the tensor's little-endian bytes, with dtype and shape, so two models can be
  compared tensor by tensor.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from qconsist.errors import InputError
from qconsist.onnxfile import REASON_CHARS, read_onnx
from qconsist.store.serde import serialized

_CHUNK = 1 << 20


@serialized
@dataclass(frozen=True)
class FileHashes:
    md5: str
    sha256: str
    size: int


@serialized
@dataclass(frozen=True)
class TensorDigest:
    sha256: str
    dtype: str
    shape: tuple[int, ...]


def hash_file(path: Path) -> FileHashes:
    """md5 and sha256 of a file's bytes, read once."""
    md5 = hashlib.md5()
    sha = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                md5.update(chunk)
                sha.update(chunk)
                size += len(chunk)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return FileHashes(md5=md5.hexdigest(), sha256=sha.hexdigest(), size=size)


def array_sha256(array: np.ndarray) -> str:
    """sha256 of an array's little-endian, C-ordered bytes."""
    arr = np.ascontiguousarray(array)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return hashlib.sha256(arr.tobytes()).hexdigest()


def tensor_digest(tensor: onnx.TensorProto) -> TensorDigest:
    array = numpy_helper.to_array(tensor)
    return TensorDigest(sha256=array_sha256(array), dtype=str(array.dtype), shape=tuple(array.shape))


def initializer_digests(model: onnx.ModelProto) -> dict[str, TensorDigest]:
    """Digest of every initializer of the main graph, by name."""
    return {init.name: tensor_digest(init) for init in model.graph.initializer}


def _strip_graph(graph: onnx.GraphProto) -> None:
    graph.doc_string = ""
    for node in graph.node:
        node.doc_string = ""
        for attr in node.attribute:
            attr.doc_string = ""
            if attr.type == onnx.AttributeProto.GRAPH:
                _strip_graph(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _strip_graph(sub)
    for value_info in list(graph.input) + list(graph.output) + list(graph.value_info):
        value_info.doc_string = ""
    canonical = []
    for init in graph.initializer:
        fresh = numpy_helper.from_array(numpy_helper.to_array(init), init.name)
        canonical.append(fresh)
    del graph.initializer[:]
    graph.initializer.extend(canonical)


def content_hash(model: onnx.ModelProto) -> str:
    """sha256 of the model with non-semantic metadata removed or put in a fixed order."""
    canon = onnx.ModelProto()
    canon.CopyFrom(model)
    canon.producer_name = ""
    canon.producer_version = ""
    canon.doc_string = ""
    canon.graph.name = ""
    props = sorted((p.key, p.value) for p in canon.metadata_props)
    del canon.metadata_props[:]
    for key, value in props:
        entry = canon.metadata_props.add()
        entry.key, entry.value = key, value
    _strip_graph(canon.graph)
    for function in canon.functions:
        function.doc_string = ""
    return hashlib.sha256(canon.SerializeToString(deterministic=True)).hexdigest()


@serialized
@dataclass(frozen=True)
class ArtifactHashes:
    """Everything qconsist records about one model artifact."""

    path: str
    md5: str
    sha256: str
    size: int
    content: str
    initializers: dict[str, TensorDigest]


def hash_artifact(path: Path, relative_to: Path | None = None, model: onnx.ModelProto | None = None) -> ArtifactHashes:
    """File, content and initializer hashes of an ONNX model file."""
    files = hash_file(path)
    if model is None:
        model = read_onnx(path, external_data=True)
    shown = str(path.relative_to(relative_to)) if relative_to else str(path)
    return ArtifactHashes(
        path=shown,
        md5=files.md5,
        sha256=files.sha256,
        size=files.size,
        content=content_hash(model),
        initializers=initializer_digests(model),
    )


# --- external data: an artifact is its whole content ---------------------------------------------------------------
# A model saved with ``save_as_external_data=True`` keeps its weights in files beside the ``.onnx`` (each tensor's
# ``location``, relative to the model's folder). Its artifact record names each such file with its size and sha256
# (``external_data``), so that a run is verified against the weights it ran and ``diff`` names the file that changed.


def _model_tensors(model: onnx.ModelProto):
    """Every tensor a model holds: initializers (sparse ones too) and tensor attributes, in every (sub)graph and
    function."""

    def nodes(found):
        for node in found:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("g"):
                    yield from graph(attr.g)
                for sub in attr.graphs:
                    yield from graph(sub)

    def graph(found: onnx.GraphProto):
        yield from found.initializer
        for sparse in found.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        yield from nodes(found.node)

    yield from graph(model.graph)
    for function in model.functions:
        yield from nodes(function.node)


def external_locations(model: onnx.ModelProto) -> dict[str, str]:
    """The external data files a model (read without its external data) names: location -> the first tensor
    stored there."""
    found: dict[str, str] = {}
    for tensor in _model_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
        found.setdefault(location, tensor.name)
    return found


def inside_folder(folder: Path, location: Any) -> Path | None:
    """``folder / location`` when ``location`` is a relative path that stays inside ``folder`` (no ``..``, not
    absolute, no link leading out), else ``None``."""
    if not isinstance(location, str) or not location or "\x00" in location:
        return None
    parts = PurePosixPath(location.replace("\\", "/"))
    if parts.is_absolute() or PureWindowsPath(location).drive or ".." in parts.parts:
        return None
    path = folder / location
    if not path.resolve().is_relative_to(folder.resolve()):
        return None
    return path


def external_data_files(path: Path, model: onnx.ModelProto) -> list[dict[str, Any]]:
    """``location`` (as the model names it), ``size`` and ``sha256`` of each external data file of the model at
    ``path`` (``model``: read without its external data), by location; a location outside the model's folder is
    refused in one line."""
    files = []
    folder = Path(path).parent
    for location, tensor in sorted(external_locations(model).items()):
        found = inside_folder(folder, location)
        if found is None:
            raise InputError(f"{path}: tensor {tensor} keeps its data in {location!r}, outside the model's folder "
                             f"{folder}; refused (external data must lie beside the model or below its folder)")
        hashes = hash_file(found)
        files.append({"location": location, "size": hashes.size, "sha256": hashes.sha256})
    return files


def read_model_and_external_data(path: Path) -> tuple[onnx.ModelProto, list[dict[str, Any]]]:
    """The model at ``path`` with its external data read in, and the record of its external data files
    (``external_data_files``, hashed before they are read)."""
    model = read_onnx(path)
    files = external_data_files(path, model)
    if files:
        from onnx.external_data_helper import load_external_data_for_model

        try:
            load_external_data_for_model(model, str(Path(path).parent))
        except Exception as exc:  # noqa: BLE001 - as read_onnx: onnx raises OSError, ValueError, ValidationError…
            reason = " ".join(str(exc).split())[:REASON_CHARS]
            raise InputError(f"{path} is not a readable ONNX model: {reason}") from None
    return model, files
