"""Caffe's protobuf messages, built from caffe2onnx's schema without its generated module.

caffe2onnx ships ``caffe_upsample_pb2.py`` generated for protobuf 3.x; current protobuf refuses to import it
unless the slow pure-Python backend is forced on the whole process. That module's serialized
``FileDescriptorProto`` is read here as data (parsed with ``ast``, never executed) and added to a private
descriptor pool, which gives message classes on whatever backend protobuf uses (upb, C++ or Python).
The module is then registered under its import name so caffe2onnx's own code uses these classes.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from functools import lru_cache
from pathlib import Path

from google.protobuf import descriptor_pool, message_factory, text_format
from google.protobuf.message import DecodeError

from qconsist.errors import InputError, UnsupportedModelError

PB2_MODULE = "caffe2onnx.proto.caffe_upsample_pb2"
_PROTO_FILE = "caffe_upsample.proto"


def _serialized_descriptor() -> bytes:
    spec = importlib.util.find_spec("caffe2onnx")
    if spec is None or spec.origin is None:
        raise UnsupportedModelError(
            "converting Caffe models needs caffe2onnx 2.0.1: install qconsist[caffe] (with pip: pip install --no-deps caffe2onnx==2.0.1; see docs/install.md)"
        )
    source = Path(spec.origin).parent / "proto" / "caffe_upsample_pb2.py"
    tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "serialized_pb":
            return ast.literal_eval(node.value)
    raise UnsupportedModelError(f"{source} holds no serialized descriptor; is this caffe2onnx 2.0.1?")


@lru_cache(maxsize=1)
def caffe_pb2() -> types.ModuleType:
    """A module with Caffe's message classes (``NetParameter``, ``LayerParameter``, ``BlobProto``…)."""
    pool = descriptor_pool.DescriptorPool()
    file_desc = pool.AddSerializedFile(_serialized_descriptor())
    module = types.ModuleType(PB2_MODULE)
    module.DESCRIPTOR = file_desc
    for name in pool.FindFileByName(_PROTO_FILE).message_types_by_name:
        setattr(module, name, message_factory.GetMessageClass(pool.FindMessageTypeByName(f"caffe.{name}")))
    sys.modules[PB2_MODULE] = module
    import caffe2onnx.proto as package  # only the package's __init__, which is empty

    package.caffe_upsample_pb2 = module  # type: ignore[attr-defined]
    return module


def read_prototxt(path: Path):
    """The network definition (text format)."""
    pb2 = caffe_pb2()
    net = pb2.NetParameter()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"prototxt {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read prototxt {path}: {exc}") from None
    try:
        text_format.Merge(text, net)
    except text_format.ParseError as exc:
        raise InputError(f"prototxt {path} is not a valid Caffe network definition: {exc}") from None
    return net


def read_caffemodel(path: Path):
    """The trained weights (binary format)."""
    pb2 = caffe_pb2()
    model = pb2.NetParameter()
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"caffemodel {path} does not exist") from None
    except OSError as exc:
        raise InputError(f"cannot read caffemodel {path}: {exc.strerror or exc}") from None
    try:
        model.ParseFromString(data)
    except DecodeError as exc:
        raise InputError(f"caffemodel {path} is truncated or corrupt ({exc}); download it again") from None
    if not (len(model.layer) or len(model.layers)):
        raise InputError(f"caffemodel {path} holds no layers; is it a Caffe weights file?")
    return model
