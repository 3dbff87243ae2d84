"""Stage convert: Caffe (prototxt + caffemodel) → ONNX with caffe2onnx, then qconsist's own repair pass.

caffe2onnx stamps the installed onnx's newest opset and IR version, which onnxruntime refuses; the model is
re-stamped with ``ConvertOptions.opset`` (default 17) and the matching IR version, then checked with
``onnx.checker`` and an onnxruntime session.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx

from qconsist.errors import ConfigError, UnsupportedModelError
from qconsist.stages.caffe.proto import caffe_pb2, read_caffemodel, read_prototxt

log = logging.getLogger(__name__)

# opset → the IR version onnx.helper pairs with it (onnx.helper.VERSION_TABLE).
SUPPORTED_OPSETS = (13, 14, 15, 16, 17, 18, 19, 20, 21)
DEFAULT_OPSET = 17

# Caffe layer types whose conversion qconsist checks numerically (tests/stages/test_convert_layers.py).
SUPPORTED_LAYERS = frozenset({
    "Input", "Convolution", "Deconvolution", "BatchNorm", "Scale", "Pooling", "ReLU", "PReLU", "Eltwise",
    "InnerProduct", "Concat", "Softmax", "Dropout", "Flatten", "Reshape",
})


@dataclass(frozen=True)
class ConvertOptions:
    opset: int = DEFAULT_OPSET
    dynamic_batch: bool = False

    def __post_init__(self) -> None:
        if self.opset not in SUPPORTED_OPSETS:
            raise ConfigError(
                f"convert.opset {self.opset} is not supported; choose one of {', '.join(map(str, SUPPORTED_OPSETS))}"
            )

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class ConvertResult:
    path: Path
    opset: int
    ir_version: int
    seconds: float
    repairs: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "path": str(self.path), "opset": self.opset, "ir_version": self.ir_version,
            "seconds": self.seconds, "repairs": list(self.repairs),
        }


def ir_version_for(opset: int) -> int:
    for entry in onnx.helper.VERSION_TABLE:
        # (release, ir_version, ai.onnx opset, ai.onnx.ml opset[, training opset])
        if entry[2] == opset:
            return entry[1]
    raise ConfigError(f"onnx does not know opset {opset}")


def _layers(net):
    return list(net.layer) if len(net.layer) else list(net.layers)


def check_supported(net) -> None:
    """Refuse, with the layer's name and type, what qconsist cannot convert faithfully."""
    if len(net.layers) and not len(net.layer):
        raise UnsupportedModelError("V1 'layers' prototxt format is not supported; upgrade it with Caffe's upgrade_net_proto_text")
    for layer in _layers(net):
        if layer.type not in SUPPORTED_LAYERS:
            raise UnsupportedModelError(
                f"layer '{layer.name}' has type '{layer.type}', which qconsist cannot convert faithfully "
                f"(supported: {', '.join(sorted(SUPPORTED_LAYERS))})"
            )


def convert_caffe(prototxt: Path, caffemodel: Path, output: Path, options: ConvertOptions = ConvertOptions()) -> ConvertResult:
    """Convert a Caffe model to ONNX at ``output`` (written atomically)."""
    from qconsist.stages.caffe.repair import repair_model
    from qconsist.store.atomic import write_bytes_atomic

    start = time.perf_counter()
    net = read_prototxt(prototxt)
    weights = read_caffemodel(caffemodel)
    check_supported(net)
    caffe_pb2()  # registers the message module caffe2onnx imports
    from caffe2onnx.src.caffe2onnx import Caffe2Onnx

    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter):
            model = Caffe2Onnx(net, weights, str(output)).createOnnxModel()
    except SystemExit:
        raise UnsupportedModelError(f"caffe2onnx gave up on {prototxt}: {chatter.getvalue().strip().splitlines()[-1:]}") from None
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
        raise UnsupportedModelError(f"caffe2onnx cannot convert {prototxt}: {type(exc).__name__}: {exc}") from None
    del model.opset_import[:]
    model.opset_import.add(domain="", version=options.opset)
    model.ir_version = ir_version_for(options.opset)
    model.producer_name = "qconsist (caffe2onnx 2.0.1)"
    repairs = repair_model(model, net, weights, options)
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise UnsupportedModelError(f"converted model fails onnx.checker: {exc}") from None
    write_bytes_atomic(Path(output), model.SerializeToString())
    return ConvertResult(
        path=Path(output), opset=options.opset, ir_version=model.ir_version,
        seconds=time.perf_counter() - start, repairs=repairs,
    )
