"""An independent numpy implementation of Caffe's forward pass (TEST phase), driven by the NetParameter.

It reads the prototxt and caffemodel messages directly (never caffe2onnx's output) and follows the
behaviour of Caffe's own layers (``src/caffe/layers/*.cpp``): convolution geometry (per-axis kernel, pad,
stride, dilation, groups), pooling's ceil rounding with "the last window starts inside the padded image",
AVE pooling divided by the window clipped to the padded image, BatchNorm statistics divided by the stored
scale factor, Reshape's ``0`` / ``-1`` / ``axis`` / ``num_axes``, Flatten's ``end_axis``, Crop's ``axis`` / ``offset``…
It is what the convert stage checks caffe2onnx's output against.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from qconsist.errors import InputError, UnsupportedModelError
from qconsist.threads import one_blas_thread
from qconsist.stages.caffe.geometry import (
    blob_array, channel_shape, conv_geometry, crop_offsets, flatten_target, input_shapes, layers_of, output_blobs, pool_geometry,
    pooled_size, reshape_target,
)

Blobs = list[np.ndarray]


def weights_by_layer(weights) -> dict[str, Blobs]:
    return {layer.name: [blob_array(b) for b in layer.blobs] for layer in layers_of(weights) if len(layer.blobs)}


def _windows(x: np.ndarray, kernel, stride, dilation, out) -> np.ndarray:
    """View (N, C, Ho, Wo, kh, kw) of a padded NCHW array."""
    n, c, _, _ = x.shape
    sn, sc, sh, sw = x.strides
    return as_strided(
        x,
        shape=(n, c, out[0], out[1], kernel[0], kernel[1]),
        strides=(sn, sc, sh * stride[0], sw * stride[1], sh * dilation[0], sw * dilation[1]),
        writeable=False,
    )


# --- layers -----------------------------------------------------------------------------------------------


def convolution(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    param = layer.convolution_param
    if param.axis != 1:
        raise UnsupportedModelError(f"Convolution '{layer.name}' has axis {param.axis}; only axis 1 is supported")
    geo = conv_geometry(param)
    x = bottoms[0]
    n, c, h, w = x.shape
    (kh, kw), (ph, pw), (sh, sw), (dh, dw) = geo["kernel"], geo["pad"], geo["stride"], geo["dilation"]
    weight = blobs[0].reshape(int(param.num_output), -1, kh, kw).astype(x.dtype)
    group = int(param.group)
    out_h = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    out_w = (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    cout = weight.shape[0]
    cin_g, cout_g = c // group, cout // group
    y = np.empty((n, cout, out_h, out_w), dtype=x.dtype)
    if (kh, kw) == (1, 1) and (ph, pw) == (0, 0):
        xs = x[:, :, : (out_h - 1) * sh + 1 : sh, : (out_w - 1) * sw + 1 : sw]
        for g in range(group):
            wg = weight[g * cout_g : (g + 1) * cout_g, :, 0, 0]
            xg = xs[:, g * cin_g : (g + 1) * cin_g].reshape(n, cin_g, -1)
            y[:, g * cout_g : (g + 1) * cout_g] = np.matmul(wg, xg).reshape(n, cout_g, out_h, out_w)
    else:
        padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        cols = _windows(padded, (kh, kw), (sh, sw), (dh, dw), (out_h, out_w))
        for g in range(group):
            cg = cols[:, g * cin_g : (g + 1) * cin_g].transpose(0, 2, 3, 1, 4, 5).reshape(n * out_h * out_w, -1)
            wg = weight[g * cout_g : (g + 1) * cout_g].reshape(cout_g, -1)
            y[:, g * cout_g : (g + 1) * cout_g] = (cg @ wg.T).reshape(n, out_h, out_w, cout_g).transpose(0, 3, 1, 2)
    if param.bias_term:
        y += blobs[1].reshape(1, -1, 1, 1).astype(x.dtype)
    return [y]


def deconvolution(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    """Caffe's Deconvolution: the backward pass of a convolution; weights (C_in, C_out / group, kh, kw)."""
    param = layer.convolution_param
    if param.axis != 1:
        raise UnsupportedModelError(f"Deconvolution '{layer.name}' has axis {param.axis}; only axis 1 is supported")
    geo = conv_geometry(param)
    x = bottoms[0]
    n, c, h, w = x.shape
    (kh, kw), (ph, pw), (sh, sw), (dh, dw) = geo["kernel"], geo["pad"], geo["stride"], geo["dilation"]
    group = int(param.group)
    cout = int(param.num_output)
    weight = blobs[0].reshape(c, cout // group, kh, kw).astype(x.dtype)
    full_h = sh * (h - 1) + dh * (kh - 1) + 1
    full_w = sw * (w - 1) + dw * (kw - 1) + 1
    full = np.zeros((n, cout, full_h, full_w), dtype=x.dtype)
    cin_g, cout_g = c // group, cout // group
    for g in range(group):
        xg = x[:, g * cin_g : (g + 1) * cin_g].reshape(n, cin_g, h * w)
        wg = weight[g * cin_g : (g + 1) * cin_g]  # (cin_g, cout_g, kh, kw)
        for i in range(kh):
            for j in range(kw):
                contrib = np.matmul(wg[:, :, i, j].T, xg).reshape(n, cout_g, h, w)
                full[:, g * cout_g : (g + 1) * cout_g, i * dh : i * dh + sh * (h - 1) + 1 : sh,
                     j * dw : j * dw + sw * (w - 1) + 1 : sw] += contrib
    y = np.ascontiguousarray(full[:, :, ph : full_h - ph, pw : full_w - pw])
    if param.bias_term:
        y += blobs[1].reshape(1, -1, 1, 1).astype(x.dtype)
    return [y]


def pooling(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    param = layer.pooling_param
    x = bottoms[0]
    n, c, h, w = x.shape
    geo = pool_geometry(param, h, w)
    (kh, kw), (ph, pw), (sh, sw) = geo["kernel"], geo["pad"], geo["stride"]
    if param.global_pooling:
        reduce = np.max if param.pool == 0 else np.mean
        return [reduce(x, axis=(2, 3), keepdims=True)]
    ceil = param.round_mode == 0
    padded_flag = bool(ph or pw)
    out_h = pooled_size(h, kh, ph, sh, ceil, padded_flag)
    out_w = pooled_size(w, kw, pw, sw, ceil, padded_flag)
    # Pad so that every window lies inside the array: ph before, enough after.
    after_h = max(0, (out_h - 1) * sh + kh - h - ph)
    after_w = max(0, (out_w - 1) * sw + kw - w - pw)
    if param.pool == 0:  # MAX: padding never wins
        fill = -np.inf
    elif param.pool == 1:  # AVE: sum, then divide by the window clipped to the padded image
        fill = 0.0
    else:
        raise UnsupportedModelError(f"Pooling '{layer.name}' uses STOCHASTIC pooling, which has no inference equivalent in ONNX")
    padded = np.pad(x, ((0, 0), (0, 0), (ph, after_h), (pw, after_w)), constant_values=fill)
    win = _windows(padded, (kh, kw), (sh, sw), (1, 1), (out_h, out_w))
    if param.pool == 0:
        return [win.max(axis=(4, 5))]
    starts_h = np.arange(out_h) * sh - ph
    starts_w = np.arange(out_w) * sw - pw
    size_h = np.minimum(starts_h + kh, h + ph) - starts_h
    size_w = np.minimum(starts_w + kw, w + pw) - starts_w
    divisor = (size_h[:, None] * size_w[None, :]).astype(x.dtype)
    return [win.sum(axis=(4, 5)) / divisor]


def batch_norm(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    param = layer.batch_norm_param
    if param.HasField("use_global_stats") and not param.use_global_stats:
        raise UnsupportedModelError(
            f"BatchNorm '{layer.name}' sets use_global_stats: false, so Caffe normalises with each batch's own "
            "statistics; an ONNX model cannot; set it to true (the stored statistics) to convert"
        )
    x = bottoms[0]
    factor = float(blobs[2].reshape(-1)[0]) if len(blobs) > 2 else 1.0
    scale = 0.0 if factor == 0 else 1.0 / factor
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean = (blobs[0].reshape(-1) * scale).reshape(shape)
    var = (blobs[1].reshape(-1) * scale).reshape(shape)
    return [((x - mean) / np.sqrt(var + float(param.eps))).astype(x.dtype)]


def scale(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    param = layer.scale_param
    x = bottoms[0]
    if len(bottoms) > 1:
        raise UnsupportedModelError(f"Scale '{layer.name}' takes its scale from a second bottom; not supported")
    axis = param.axis % x.ndim
    count = x.ndim - axis if param.num_axes == -1 else int(param.num_axes)
    shape = channel_shape(x.ndim, axis, x.shape[axis : axis + count])
    y = x * blobs[0].reshape(shape).astype(x.dtype)
    if param.bias_term:
        y = y + blobs[1].reshape(shape).astype(x.dtype)
    return [y]


def relu(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    x = bottoms[0]
    slope = float(layer.relu_param.negative_slope)
    return [np.maximum(x, 0) + slope * np.minimum(x, 0)]


def prelu(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    x = bottoms[0]
    slope = blobs[0].reshape(-1).astype(x.dtype)
    if not layer.prelu_param.channel_shared:
        slope = slope.reshape(channel_shape(x.ndim, 1, x.shape[1:2]))
    return [np.maximum(x, 0) + slope * np.minimum(x, 0)]


def eltwise(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    param = layer.eltwise_param
    if param.operation == 0:
        return [math.prod(bottoms[1:], start=bottoms[0])]
    if param.operation == 2:
        return [np.maximum.reduce(bottoms)]
    coeff = list(param.coeff) or [1.0] * len(bottoms)
    if len(coeff) != len(bottoms):
        raise InputError(f"Eltwise '{layer.name}' has {len(coeff)} coefficients for {len(bottoms)} bottoms")
    return [sum(np.asarray(k, dtype=b.dtype) * b for k, b in zip(coeff, bottoms))]


def inner_product(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    param = layer.inner_product_param
    x = bottoms[0]
    axis = param.axis % x.ndim
    rows, depth = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
    num = int(param.num_output)
    weight = blobs[0].reshape((depth, num) if param.transpose else (num, depth)).astype(x.dtype)
    y = x.reshape(rows, depth) @ (weight if param.transpose else weight.T)
    if param.bias_term:
        y = y + blobs[1].reshape(1, num).astype(x.dtype)
    return [y.reshape(x.shape[:axis] + (num,))]


def concat(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    param = layer.concat_param
    axis = param.concat_dim if param.HasField("concat_dim") else param.axis
    return [np.concatenate(bottoms, axis=axis % bottoms[0].ndim)]


def softmax(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    x = bottoms[0]
    axis = layer.softmax_param.axis % x.ndim
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return [e / e.sum(axis=axis, keepdims=True)]


def dropout(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    return [bottoms[0]]  # TEST phase: identity (Caffe scales by 1 / (1 - ratio) while training instead)


def flatten(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    return [bottoms[0].reshape(flatten_target(layer, bottoms[0].shape))]


def reshape(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    return [bottoms[0].reshape(reshape_target(layer, bottoms[0].shape))]


def crop(layer, bottoms: Blobs, blobs: Blobs) -> Blobs:
    """Caffe's Crop: the first bottom cut to the second's shape from ``axis`` on, starting at ``offset``."""
    data, size = bottoms[0], bottoms[1]
    offsets = crop_offsets(layer, data.shape, size.shape)
    start = layer.crop_param.axis % data.ndim
    window = tuple(slice(o, o + (size.shape[i] if i >= start else data.shape[i])) for i, o in enumerate(offsets))
    return [np.ascontiguousarray(data[window])]


LAYERS: dict[str, Callable[..., Blobs]] = {
    "Convolution": convolution,
    "Deconvolution": deconvolution,
    "Pooling": pooling,
    "BatchNorm": batch_norm,
    "Scale": scale,
    "ReLU": relu,
    "PReLU": prelu,
    "Eltwise": eltwise,
    "InnerProduct": inner_product,
    "Concat": concat,
    "Softmax": softmax,
    "Dropout": dropout,
    "Flatten": flatten,
    "Reshape": reshape,
    "Crop": crop,
}


def forward(net, weights, inputs: dict[str, np.ndarray], dtype=np.float32, keep_all: bool = False) -> dict[str, np.ndarray]:
    """Run the network on ``inputs`` (keyed by Caffe input blob name); return the output blobs
    (every blob with ``keep_all``). The matrix products run on one BLAS thread (``qconsist.threads``): the
    result is the same bytes whatever the machine's thread counts."""
    with one_blas_thread():
        return _forward(net, weights, inputs, dtype, keep_all)


def _forward(net, weights, inputs: dict[str, np.ndarray], dtype, keep_all: bool) -> dict[str, np.ndarray]:
    params = weights if isinstance(weights, dict) else weights_by_layer(weights)
    blobs: dict[str, np.ndarray] = {}
    for name, shape in input_shapes(net).items():
        if name not in inputs:
            raise InputError(f"no value for the network input '{name}'")
        value = np.asarray(inputs[name], dtype=dtype)
        if value.shape[1:] != tuple(shape[1:]):
            raise InputError(f"input '{name}' has shape {list(value.shape)}; the network expects {list(shape)}")
        blobs[name] = value
    for layer in layers_of(net):
        if layer.type == "Input":
            continue
        run = LAYERS.get(layer.type)
        if run is None:
            raise UnsupportedModelError(f"layer '{layer.name}' has type '{layer.type}', which the reference does not implement")
        bottoms = [blobs[b] for b in layer.bottom]
        tops = run(layer, bottoms, params.get(layer.name, []))
        for name, value in zip(layer.top, tops):
            blobs[name] = np.asarray(value, dtype=dtype)
    if keep_all:
        return blobs
    return {name: blobs[name] for name in output_blobs(net)}
