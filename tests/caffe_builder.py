"""Small Caffe models written in code: the prototxt (text) and the caffemodel (binary), seeded weights.

    net = NetBuilder(seed=3)
    x = net.input((1, 4, 9, 9))
    x = net.conv(x, 8, kernel_size=3, pad=1, group=2)
    x = net.batch_norm(x, factor=999.98)
    x = net.scale(x, bias=True)
    prototxt, caffemodel = net.write(tmp_path)

Blob shapes are read off the network built so far (Caffe's shape rules, ``caffe_geometry.infer_shapes``), so a
helper only needs the layer's own parameters.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf import text_format

from qconsist.stages.caffe import geometry as caffe_geometry
from qconsist.stages.caffe.proto import caffe_pb2, read_caffemodel, read_prototxt
from qconsist.stages.caffe.repair import initializers_out_of_inputs
from qconsist.stages.convert import ir_version_for

POOL = {"MAX": 0, "AVE": 1, "STOCHASTIC": 2}
ELTWISE = {"PROD": 0, "SUM": 1, "MAX": 2}


def _fill(message, values: dict[str, Any]) -> None:
    for key, value in values.items():
        field = message.DESCRIPTOR.fields_by_name[key]
        if field.message_type is not None:
            _fill(getattr(message, key), value)
        elif field.is_repeated:
            getattr(message, key).extend(value if isinstance(value, (list, tuple)) else [value])
        else:
            setattr(message, key, value)


class NetBuilder:
    def __init__(self, name: str = "generated", seed: int = 0) -> None:
        self.pb2 = caffe_pb2()
        self.net = self.pb2.NetParameter(name=name)
        self.blobs: dict[str, list[np.ndarray]] = {}
        self.rng = np.random.default_rng(seed)
        self._count = 0

    # --- generic ------------------------------------------------------------------------------------------

    def input(self, shape: Sequence[int], name: str = "data") -> str:
        layer = self.net.layer.add(name=name, type="Input")
        layer.top.append(name)
        layer.input_param.shape.add().dim.extend(int(d) for d in shape)
        return name

    def add(self, type: str, bottom: str | Sequence[str], top: str | None = None, *, name: str | None = None,
            blobs: Sequence[np.ndarray] = (), **params: dict[str, Any]) -> str:
        """Append a layer; ``top=None`` names the top after the layer, ``top=bottom`` makes it in place."""
        self._count += 1
        name = name or f"{type.lower()}{self._count}"
        layer = self.net.layer.add(name=name, type=type)
        layer.bottom.extend([bottom] if isinstance(bottom, str) else list(bottom))
        layer.top.append(top or name)
        for key, values in params.items():
            _fill(getattr(layer, key), values)
        if blobs:
            self.blobs[name] = [np.asarray(b, dtype=np.float32) for b in blobs]
        return top or name

    def shape(self, blob: str) -> tuple[int, ...]:
        return caffe_geometry.infer_shapes(self.net)[blob]

    def normal(self, *shape: int, scale: float = 1.0) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    # --- layers -------------------------------------------------------------------------------------------

    def conv(self, bottom: str, num_output: int, *, group: int = 1, bias: bool = True, deconv: bool = False,
             top: str | None = None, **geometry: Any) -> str:
        """Convolution / Deconvolution; ``geometry``: kernel_size, pad, stride, dilation (one value or a list),
        kernel_h/kernel_w, pad_h/pad_w, stride_h/stride_w."""
        channels = self.shape(bottom)[1]
        param = {"num_output": num_output, "group": group, "bias_term": bias, **geometry}
        probe = self.pb2.ConvolutionParameter()
        _fill(probe, param)
        kh, kw = caffe_geometry.conv_geometry(probe)["kernel"]
        wshape = (channels, num_output // group, kh, kw) if deconv else (num_output, channels // group, kh, kw)
        fan_in = (channels // group) * kh * kw
        blobs = [self.normal(*wshape, scale=1.0 / np.sqrt(fan_in))]
        if bias:
            blobs.append(self.normal(num_output, scale=0.5))
        kind = "Deconvolution" if deconv else "Convolution"
        return self.add(kind, bottom, top, blobs=blobs, convolution_param=param)

    def batch_norm(self, bottom: str, *, factor: float = 999.98, eps: float | None = None, in_place: bool = True,
                   use_global_stats: bool | None = True) -> str:
        """Caffe's BatchNorm with its three blobs: running mean and variance, both multiplied by the
        moving-average scale factor (the third blob), as Caffe stores them."""
        channels = self.shape(bottom)[1]
        mean = self.normal(channels, scale=0.5)
        var = self.rng.uniform(0.5, 2.0, channels).astype(np.float32)
        param: dict[str, Any] = {}
        if eps is not None:
            param["eps"] = eps
        if use_global_stats is not None:
            param["use_global_stats"] = use_global_stats
        blobs = [mean * factor, var * factor, np.array([factor], np.float32)]
        return self.add("BatchNorm", bottom, bottom if in_place else None, blobs=blobs, batch_norm_param=param)

    def scale(self, bottom: str, *, bias: bool = True, axis: int = 1, num_axes: int = 1, in_place: bool = True) -> str:
        shape = self.shape(bottom)
        start = axis % len(shape)
        dims = shape[start:] if num_axes == -1 else shape[start : start + num_axes]
        blobs = [self.rng.uniform(0.5, 1.5, dims).astype(np.float32)]
        if bias:
            blobs.append(self.normal(*dims, scale=0.5))
        param = {"bias_term": bias, "axis": axis, "num_axes": num_axes}
        return self.add("Scale", bottom, bottom if in_place else None, blobs=blobs, scale_param=param)

    def pool(self, bottom: str, pool: str = "MAX", top: str | None = None, **geometry: Any) -> str:
        return self.add("Pooling", bottom, top, pooling_param={"pool": POOL[pool], **geometry})

    def relu(self, bottom: str, negative_slope: float = 0.0, in_place: bool = True) -> str:
        param = {"negative_slope": negative_slope} if negative_slope else {}
        return self.add("ReLU", bottom, bottom if in_place else None, relu_param=param)

    def prelu(self, bottom: str, channel_shared: bool = False) -> str:
        count = 1 if channel_shared else self.shape(bottom)[1]
        slope = self.rng.uniform(0.05, 0.6, count).astype(np.float32)
        return self.add("PReLU", bottom, None, blobs=[slope], prelu_param={"channel_shared": channel_shared})

    def eltwise(self, bottoms: Sequence[str], operation: str = "SUM", coeff: Sequence[float] = ()) -> str:
        param: dict[str, Any] = {"operation": ELTWISE[operation]}
        if coeff:
            param["coeff"] = list(coeff)
        return self.add("Eltwise", list(bottoms), None, eltwise_param=param)

    def inner_product(self, bottom: str, num_output: int, *, axis: int = 1, transpose: bool = False, bias: bool = True) -> str:
        shape = self.shape(bottom)
        depth = int(np.prod(shape[axis % len(shape) :]))
        weight = self.normal(num_output, depth, scale=1.0 / np.sqrt(depth))
        blobs = [weight.T.copy() if transpose else weight]
        if bias:
            blobs.append(self.normal(num_output, scale=0.5))
        param = {"num_output": num_output, "axis": axis, "transpose": transpose, "bias_term": bias}
        return self.add("InnerProduct", bottom, None, blobs=blobs, inner_product_param=param)

    def concat(self, bottoms: Sequence[str], axis: int = 1) -> str:
        return self.add("Concat", list(bottoms), None, concat_param={"axis": axis})

    def softmax(self, bottom: str, axis: int = 1) -> str:
        return self.add("Softmax", bottom, None, softmax_param={"axis": axis})

    def dropout(self, bottom: str, ratio: float = 0.5, in_place: bool = True) -> str:
        return self.add("Dropout", bottom, bottom if in_place else None, dropout_param={"dropout_ratio": ratio})

    def flatten(self, bottom: str, axis: int = 1, end_axis: int = -1) -> str:
        return self.add("Flatten", bottom, None, flatten_param={"axis": axis, "end_axis": end_axis})

    def reshape(self, bottom: str, dims: Sequence[int], axis: int = 0, num_axes: int = -1) -> str:
        param = {"shape": {"dim": list(dims)}, "axis": axis, "num_axes": num_axes}
        return self.add("Reshape", bottom, None, reshape_param=param)

    def crop(self, bottom: str, like: str, axis: int = 2, offset: int | Sequence[int] = (), top: str | None = None) -> str:
        """Caffe's Crop: ``bottom`` cut to ``like``'s shape from ``axis`` on, starting at ``offset``."""
        param: dict[str, Any] = {"axis": axis}
        if offset != ():
            param["offset"] = [offset] if isinstance(offset, int) else list(offset)
        return self.add("Crop", [bottom, like], top, crop_param=param)

    # --- files --------------------------------------------------------------------------------------------

    def caffemodel(self):
        """The weights file's message: every layer (as Caffe saves it) with its blobs."""
        model = self.pb2.NetParameter(name=self.net.name)
        for layer in self.net.layer:
            saved = model.layer.add()
            saved.CopyFrom(layer)
            for array in self.blobs.get(layer.name, []):
                blob = saved.blobs.add()
                blob.shape.dim.extend(array.shape)
                blob.data.extend(array.reshape(-1).tolist())
        return model

    def write(self, directory: Path, stem: str | None = None) -> tuple[Path, Path]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        stem = stem or self.net.name
        prototxt = directory / f"{stem}.prototxt"
        caffemodel = directory / f"{stem}.caffemodel"
        prototxt.write_text(text_format.MessageToString(self.net), encoding="utf-8")
        caffemodel.write_bytes(self.caffemodel().SerializeToString())
        return prototxt, caffemodel


# --- the layer cases the convert tests and benchmarks/convert_fidelity.py share ------------------------


class Case:
    """One layer type / parameter variant: how to build it, and what caffe2onnx 2.0.1 alone does with it.

    ``alone``: ``"ok"`` (faithful), ``"crash"`` (caffe2onnx raises), ``"invalid"`` (its model fails the
    checker or onnxruntime), ``"wrong"`` (runs, but shape or values differ from Caffe's).
    ``repair``: a phrase qconsist's repair line for it contains (None: nothing to repair).
    """

    def __init__(self, id: str, layer: str, build, *, shape=(2, 4, 9, 9), alone: str = "ok", repair: str | None = None):
        self.id, self.layer, self.build, self.shape, self.alone, self.repair = id, layer, build, shape, alone, repair

    def network(self, seed: int = 0) -> NetBuilder:
        net = NetBuilder(name=self.id.replace(" ", "_").replace("/", "_"), seed=seed)
        self.build(net, net.input(self.shape))
        return net


def _conv1(n, x, c=4):
    return n.conv(x, c, kernel_size=1)


def _fcn_skip(n, x):
    """FCN's skip: a score map upsampled without pad (9 → 20), cropped at offset 1 to a finer map (18) and added."""
    finer = n.conv(x, 4, kernel_size=2, stride=2, deconv=True)
    upsampled = n.conv(x, 4, kernel_size=4, stride=2, bias=False, deconv=True)
    return n.eltwise([n.crop(upsampled, finer, offset=1), finer])


LAYER_CASES = [
    Case("conv 3x3", "Convolution", lambda n, x: n.conv(x, 6, kernel_size=3)),
    Case("conv pad 1 stride 2", "Convolution", lambda n, x: n.conv(x, 6, kernel_size=3, pad=1, stride=2)),
    Case("conv group 2 dilation 2", "Convolution", lambda n, x: n.conv(x, 6, kernel_size=3, pad=2, group=2, dilation=2)),
    Case("conv depthwise", "Convolution", lambda n, x: n.conv(x, 4, kernel_size=3, pad=1, group=4)),
    Case("conv no bias", "Convolution", lambda n, x: n.conv(x, 6, kernel_size=3, bias=False)),
    Case("conv kernel_h/w pad_h/w stride_h/w", "Convolution",
         lambda n, x: n.conv(x, 6, kernel_h=3, kernel_w=1, pad_h=1, pad_w=0, stride_h=2, stride_w=1)),
    Case("conv kernel/pad/stride per axis", "Convolution",
         lambda n, x: n.conv(x, 6, kernel_size=[3, 1], pad=[1, 0], stride=[2, 1]), alone="invalid", repair="Convolution geometry"),
    Case("conv dilation per axis", "Convolution",
         lambda n, x: n.conv(x, 6, kernel_size=3, dilation=[2, 1], pad=[2, 1]), alone="invalid", repair="Convolution geometry"),
    Case("conv 1x1 stride 2", "Convolution", lambda n, x: n.conv(x, 5, kernel_size=1, stride=2)),
    Case("deconv 3x3", "Deconvolution", lambda n, x: n.conv(x, 6, kernel_size=3, deconv=True)),
    Case("deconv stride 2 pad 1", "Deconvolution", lambda n, x: n.conv(x, 6, kernel_size=4, stride=2, pad=1, deconv=True)),
    Case("deconv group 2", "Deconvolution", lambda n, x: n.conv(x, 6, kernel_size=3, stride=2, group=2, deconv=True)),
    Case("deconv dilation 2", "Deconvolution", lambda n, x: n.conv(x, 6, kernel_size=3, dilation=2, deconv=True), alone="invalid",
         repair="output shapes"),
    Case("deconv no bias", "Deconvolution", lambda n, x: n.conv(x, 6, kernel_size=2, stride=2, bias=False, deconv=True)),
    Case("batchnorm + scale", "BatchNorm", lambda n, x: n.scale(n.batch_norm(_conv1(n, x))), repair="BatchNorm statistics"),
    Case("batchnorm factor 1", "BatchNorm", lambda n, x: n.scale(n.batch_norm(_conv1(n, x), factor=1.0)),
         repair="BatchNorm statistics"),
    Case("batchnorm factor 0", "BatchNorm", lambda n, x: n.scale(n.batch_norm(_conv1(n, x), factor=0.0)), alone="crash",
         repair="factor 0"),
    Case("batchnorm eps 1e-3", "BatchNorm", lambda n, x: n.scale(n.batch_norm(_conv1(n, x), eps=1e-3)), repair="BatchNorm statistics"),
    Case("batchnorm + scale without bias", "BatchNorm", lambda n, x: n.scale(n.batch_norm(_conv1(n, x)), bias=False), alone="crash",
         repair="fused with bias 0"),
    Case("batchnorm alone", "BatchNorm", lambda n, x: n.batch_norm(_conv1(n, x)), alone="crash", repair="scale 1"),
    Case("batchnorm + scale not in place", "BatchNorm",
         lambda n, x: n.relu(n.scale(n.batch_norm(_conv1(n, x), in_place=False), in_place=False), in_place=False), alone="crash",
         repair="under the Scale's top"),
    Case("scale with bias", "Scale", lambda n, x: n.scale(_conv1(n, x))),
    Case("scale without bias", "Scale", lambda n, x: n.scale(_conv1(n, x), bias=False)),
    Case("scale axis 2", "Scale", lambda n, x: n.scale(_conv1(n, x), axis=2), alone="invalid", repair="Scale blobs"),
    Case("scale num_axes 2", "Scale", lambda n, x: n.scale(_conv1(n, x), num_axes=2), alone="crash", repair="Scale blobs"),
    Case("scale on 2-D blob", "Scale", lambda n, x: n.scale(n.inner_product(x, 5)), alone="invalid", repair="Scale blobs"),
    Case("max pool 3/2 ceil", "Pooling", lambda n, x: n.pool(x, "MAX", kernel_size=3, stride=2), repair="Pad node"),
    Case("max pool 2/2 pad 1 (last window dropped)", "Pooling", lambda n, x: n.pool(x, "MAX", kernel_size=2, stride=2, pad=1),
         alone="wrong", repair="ceil_mode=0"),
    Case("max pool 3/2 pad 1", "Pooling", lambda n, x: n.pool(x, "MAX", kernel_size=3, stride=2, pad=1), repair="Pad node"),
    Case("max pool floor", "Pooling", lambda n, x: n.pool(x, "MAX", kernel_size=2, stride=2, round_mode=1), repair="Pad node"),
    Case("max pool pad_h only", "Pooling", lambda n, x: n.pool(x, "MAX", kernel_size=3, pad_h=1, pad_w=0, stride=2),
         alone="wrong", repair="pads=[1, 0, 1, 0]"),
    Case("ave pool 3/2 ceil", "Pooling", lambda n, x: n.pool(x, "AVE", kernel_size=3, stride=2), repair="Pad node"),
    Case("ave pool 3/2 pad 1", "Pooling", lambda n, x: n.pool(x, "AVE", kernel_size=3, stride=2, pad=1), repair="count_include_pad=1"),
    Case("ave pool 2/2 pad 1 (last window dropped)", "Pooling", lambda n, x: n.pool(x, "AVE", kernel_size=2, stride=2, pad=1),
         alone="wrong", repair="ceil_mode=0"),
    Case("ave pool 3/1 pad 1", "Pooling", lambda n, x: n.pool(x, "AVE", kernel_size=3, stride=1, pad=1), repair="count_include_pad=1"),
    Case("ave pool 3/2 pad 1 on 10x10 (partial window)", "Pooling",
         lambda n, x: n.pool(x, "AVE", kernel_size=3, stride=2, pad=1), shape=(2, 3, 10, 10), repair="count_include_pad=1"),
    Case("ave pool kernel_h/w pad_h/w", "Pooling",
         lambda n, x: n.pool(x, "AVE", kernel_h=3, kernel_w=2, pad_h=1, pad_w=0, stride_h=2, stride_w=1), alone="wrong",
         repair="count_include_pad=1"),
    Case("global max pool", "Pooling", lambda n, x: n.pool(x, "MAX", global_pooling=True), repair="Pad node"),
    Case("global ave pool", "Pooling", lambda n, x: n.pool(x, "AVE", global_pooling=True), repair="Pad node"),
    Case("relu", "ReLU", lambda n, x: n.relu(_conv1(n, x))),
    Case("relu negative_slope", "ReLU", lambda n, x: n.relu(_conv1(n, x), 0.1)),
    Case("prelu", "PReLU", lambda n, x: n.prelu(x), alone="invalid", repair="PReLU slope"),
    Case("prelu C == W", "PReLU", lambda n, x: n.prelu(x), shape=(2, 5, 3, 5), alone="wrong", repair="PReLU slope"),
    Case("prelu channel_shared", "PReLU", lambda n, x: n.prelu(x, channel_shared=True)),
    Case("eltwise sum", "Eltwise", lambda n, x: n.eltwise([_conv1(n, x), x])),
    Case("eltwise sum coeff", "Eltwise", lambda n, x: n.eltwise([_conv1(n, x), x], coeff=[0.5, -1.0]), alone="wrong", repair="coefficients"),
    Case("eltwise sum of 3", "Eltwise", lambda n, x: n.eltwise([_conv1(n, x), x, _conv1(n, x)]), alone="invalid", repair="SUM over 3"),
    Case("eltwise prod", "Eltwise", lambda n, x: n.eltwise([_conv1(n, x), x], "PROD"), alone="crash", repair="PROD"),
    Case("eltwise prod of 3", "Eltwise", lambda n, x: n.eltwise([_conv1(n, x), x, _conv1(n, x)], "PROD"), alone="crash", repair="PROD"),
    Case("eltwise max", "Eltwise", lambda n, x: n.eltwise([_conv1(n, x), x], "MAX"), alone="crash", repair="MAX"),
    Case("eltwise max of 3", "Eltwise", lambda n, x: n.eltwise([_conv1(n, x), x, _conv1(n, x)], "MAX"), alone="crash", repair="MAX"),
    Case("inner product", "InnerProduct", lambda n, x: n.inner_product(x, 5)),
    Case("inner product no bias", "InnerProduct", lambda n, x: n.inner_product(x, 5, bias=False)),
    Case("inner product transpose", "InnerProduct", lambda n, x: n.inner_product(x, 5, transpose=True), alone="invalid",
         repair="transpose"),
    Case("inner product transpose square", "InnerProduct", lambda n, x: n.inner_product(x, 36, transpose=True),
         shape=(2, 4, 3, 3), alone="wrong", repair="transpose"),
    Case("inner product axis 2", "InnerProduct", lambda n, x: n.inner_product(x, 5, axis=2), alone="invalid", repair="axis 2"),
    Case("inner product on 2-D", "InnerProduct", lambda n, x: n.inner_product(n.inner_product(x, 7), 5)),
    Case("concat axis 1", "Concat", lambda n, x: n.concat([x, n.conv(x, 3, kernel_size=1)])),
    Case("concat axis 2", "Concat", lambda n, x: n.concat([x, _conv1(n, x)], axis=2)),
    Case("concat axis -1", "Concat", lambda n, x: n.concat([_conv1(n, x), x], axis=-1)),
    Case("concat of the input with itself", "Concat", lambda n, x: n.concat([x, x]), alone="wrong", repair="reads its bottoms"),
    Case("softmax", "Softmax", lambda n, x: n.softmax(x)),
    Case("softmax axis 2", "Softmax", lambda n, x: n.softmax(x, axis=2)),
    Case("softmax on 2-D", "Softmax", lambda n, x: n.softmax(n.inner_product(x, 5))),
    Case("dropout in place", "Dropout", lambda n, x: n.dropout(_conv1(n, x)), alone="invalid", repair="Identity"),
    Case("dropout", "Dropout", lambda n, x: n.relu(n.dropout(_conv1(n, x), in_place=False)), alone="invalid", repair="Identity"),
    Case("flatten", "Flatten", lambda n, x: n.flatten(x)),
    Case("flatten end_axis 2", "Flatten", lambda n, x: n.flatten(x, end_axis=2), alone="wrong", repair="end_axis 2"),
    Case("flatten axis 2", "Flatten", lambda n, x: n.flatten(x, axis=2), alone="crash", repair="axis 2"),
    Case("reshape 0 -1", "Reshape", lambda n, x: n.reshape(x, [0, -1])),
    Case("reshape 0 2 -1 9", "Reshape", lambda n, x: n.reshape(x, [0, 2, -1, 9])),
    Case("reshape axis 1 num_axes 1", "Reshape", lambda n, x: n.reshape(x, [2, 2], axis=1, num_axes=1), alone="invalid",
         repair="num_axes 1"),
    Case("reshape axis 2 -1", "Reshape", lambda n, x: n.reshape(x, [-1], axis=2), alone="wrong", repair="axis 2"),
    Case("reshape axis -1 (append)", "Reshape", lambda n, x: n.reshape(x, [3, 3], axis=-2, num_axes=1), alone="invalid",
         repair="axis -2"),
    Case("crop offset 1", "Crop", lambda n, x: n.crop(x, n.conv(x, 4, kernel_size=3), offset=1), alone="wrong",
         repair="size reference"),
    Case("crop offset per axis", "Crop", lambda n, x: n.crop(x, n.conv(x, 4, kernel_size=3), offset=[1, 2]), alone="wrong",
         repair="size reference"),
    Case("crop no offset", "Crop", lambda n, x: n.crop(x, n.conv(x, 4, kernel_size=3)), alone="wrong", repair="size reference"),
    Case("crop axis 1", "Crop", lambda n, x: n.crop(x, n.conv(x, 3, kernel_size=3), axis=1, offset=[1, 1, 2]), alone="wrong",
         repair="size reference"),
    Case("crop axis 3", "Crop", lambda n, x: n.crop(x, n.conv(x, 4, kernel_size=3), axis=3, offset=2), alone="wrong",
         repair="axes before it kept"),
    Case("crop axis -2", "Crop", lambda n, x: n.crop(x, n.conv(x, 4, kernel_size=3), axis=-2, offset=1), alone="crash",
         repair="negative one"),
    Case("crop keeps the channels before axis", "Crop",
         lambda n, x: n.crop(n.conv(x, 6, kernel_size=1), n.conv(x, 3, kernel_size=3), offset=1), alone="wrong",
         repair="axes before it kept"),
    Case("crop of equal shapes", "Crop", lambda n, x: n.eltwise([n.crop(_conv1(n, x), x), x])),
    Case("deconv k4 s2 + crop + eltwise (FCN skip)", "Crop", lambda n, x: _fcn_skip(n, x)),
    Case("resnet block", "(chain)", lambda n, x: n.relu(n.eltwise([
        n.scale(n.batch_norm(n.conv(n.relu(n.scale(n.batch_norm(n.conv(x, 4, kernel_size=3, pad=1)))), 4, kernel_size=3, pad=1))),
        x])), repair="BatchNorm statistics"),
]


# --- running and judging (tests and benchmarks/convert_fidelity.py) ----------------------------------------

RTOL = 1e-5


def tolerance(expected: np.ndarray) -> float:
    """Layer tolerance: 1e-5 * (1 + peak), peak = max |reference| (float64 reference, float32 ONNX)."""
    return RTOL * (1.0 + float(np.abs(expected).max()))


def session(model, optimize: bool = True, quiet: bool = False) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 4 if quiet else 3  # quiet: failures are expected (caffe2onnx alone)
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])


def run(sess: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    feeds = {meta.name: value for meta, value in zip(sess.get_inputs(), inputs.values())}
    return sess.run(None, feeds)


def caffe2onnx_alone(prototxt, caffemodel) -> onnx.ModelProto:
    """caffe2onnx 2.0.1 as shipped: only the opset is re-stamped and the weights taken out of the inputs
    (without those two nothing loads in onnxruntime 1.31)."""
    net, weights = read_prototxt(prototxt), read_caffemodel(caffemodel)
    caffe_pb2()
    from caffe2onnx.src.caffe2onnx import Caffe2Onnx

    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Caffe2Onnx(net, weights, "alone").createOnnxModel()
    del model.opset_import[:]
    model.opset_import.add(domain="", version=17)
    model.ir_version = ir_version_for(17)
    initializers_out_of_inputs(model)
    return model


def verdict_alone(case: Case, prototxt, caffemodel, inputs, expected: list[np.ndarray]) -> str:
    try:
        model = caffe2onnx_alone(prototxt, caffemodel)
    except (Exception, SystemExit):  # noqa: BLE001 - any failure of caffe2onnx itself is the verdict
        return "crash"
    try:
        onnx.checker.check_model(model, full_check=True)
        runs = [run(session(model, optimize, quiet=True), inputs) for optimize in (True, False)]
    except Exception:  # noqa: BLE001 - checker or onnxruntime refusing the model is the verdict
        return "invalid"
    for actual in runs:  # wrong at either optimisation level is wrong
        for got, want in zip(actual, expected):
            if got.shape != want.shape or np.abs(got - want).max() > tolerance(want):
                return "wrong"
    return "ok"
