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
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from qconsist.errors import InputError
from qconsist.onnxfile import read_onnx
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
