"""Hashes: file bytes, model content that ignores metadata, per-initializer digests."""

import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qconsist.errors import InputError
from qconsist.store.hashing import array_sha256, content_hash, hash_artifact, hash_file, initializer_digests


def _model(weight: np.ndarray, producer: str = "a", doc: str = "", props: dict | None = None) -> onnx.ModelProto:
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm", doc_string=doc)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(weight, "w")],
        doc_string=doc,
    )
    model = helper.make_model(graph, producer_name=producer, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in (props or {}).items():
        helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, key: value})
    return model


def test_hash_file_matches_hashlib(tmp_path):
    data = bytes(range(256)) * 5000
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    hashes = hash_file(path)
    assert hashes.md5 == hashlib.md5(data).hexdigest()
    assert hashes.sha256 == hashlib.sha256(data).hexdigest()
    assert hashes.size == len(data)


def test_hash_file_missing(tmp_path):
    with pytest.raises(InputError, match=r"cannot read .*nope\.bin"):
        hash_file(tmp_path / "nope.bin")


def test_content_hash_ignores_metadata_but_not_weights():
    w = np.arange(4, dtype=np.float32).reshape(2, 2)
    base = _model(w, producer="a", doc="", props={"k1": "v1", "k2": "v2"})
    other_meta = _model(w, producer="b", doc="a doc string", props={"k2": "v2", "k1": "v1"})
    assert base.SerializeToString() != other_meta.SerializeToString()
    assert content_hash(base) == content_hash(other_meta)
    # the same weights stored as float_data instead of raw_data are the same content
    as_floats = _model(w)
    as_floats.graph.initializer[0].CopyFrom(helper.make_tensor("w", TensorProto.FLOAT, [2, 2], w.reshape(-1).tolist()))
    assert content_hash(as_floats) == content_hash(_model(w))
    changed = w.copy()
    changed[1, 1] = np.nextafter(changed[1, 1], np.float32(10))  # one ULP
    assert content_hash(_model(changed)) != content_hash(_model(w))


def test_initializer_digests_name_dtype_shape():
    w = np.arange(6, dtype=np.int8).reshape(2, 3)
    digests = initializer_digests(_model(w.astype(np.float32)))
    assert set(digests) == {"w"}
    assert digests["w"].dtype == "float32" and digests["w"].shape == (2, 3)
    assert digests["w"].sha256 == array_sha256(w.astype(np.float32))


def test_array_sha256_is_byte_order_independent():
    a = np.arange(5, dtype="<f4")
    assert array_sha256(a) == array_sha256(a.astype(">f4"))


def test_hash_artifact_reports_unreadable_model(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01garbage")
    with pytest.raises(InputError, match="is not a readable ONNX model"):
        hash_artifact(bad)


def test_hash_artifact_relative_path(tmp_path):
    path = tmp_path / "stage" / "model.onnx"
    path.parent.mkdir()
    onnx.save(_model(np.eye(2, dtype=np.float32)), path)
    art = hash_artifact(path, relative_to=tmp_path)
    assert art.path == "stage/model.onnx"
    assert art.md5 == hashlib.md5(path.read_bytes()).hexdigest()
    assert art.to_json()["initializers"]["w"]["shape"] == [2, 2]
    assert type(art).from_json(art.to_json()) == art
