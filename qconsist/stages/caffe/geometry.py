"""Caffe's network structure and layer geometry, read from the NetParameter: inputs, outputs, blobs,
convolution / pooling parameters as Caffe resolves them, and every blob's shape (no arithmetic on data).

Shared by the numpy reference (``reference.py``), the pre-conversion rewrite (``normalize.py``) and the
post-conversion repairs (``repair.py``).
"""

from __future__ import annotations

import math

import numpy as np

from qconsist.errors import InputError, UnsupportedModelError

Shape = tuple[int, ...]


def layers_of(net) -> list:
    return list(net.layer) if len(net.layer) else list(net.layers)


def blob_array(blob) -> np.ndarray:
    """A BlobProto as a float64 array (its ``shape``, or the legacy num/channels/height/width)."""
    data = np.asarray(blob.double_data if len(blob.double_data) else blob.data, dtype=np.float64)
    if blob.HasField("shape"):
        shape = tuple(int(d) for d in blob.shape.dim)
    else:
        shape = tuple(int(d) for d in (blob.num, blob.channels, blob.height, blob.width))
    if math.prod(shape) != data.size:
        raise InputError(f"caffemodel blob holds {data.size} values but declares shape {list(shape)}")
    return data.reshape(shape)


def input_shapes(net) -> dict[str, Shape]:
    """The network's inputs: ``Input`` layers, or the legacy ``input`` + ``input_shape`` / ``input_dim``."""
    shapes: dict[str, Shape] = {}
    if len(net.input):
        if len(net.input_shape):
            dims = [tuple(int(d) for d in s.dim) for s in net.input_shape]
        else:
            flat = [int(d) for d in net.input_dim]
            dims = [tuple(flat[i : i + 4]) for i in range(0, len(flat), 4)]
        shapes.update(zip(net.input, dims))
    for layer in layers_of(net):
        if layer.type == "Input":
            param = list(layer.input_param.shape)
            for i, top in enumerate(layer.top):
                shape = param[i] if i < len(param) else param[0]
                shapes[top] = tuple(int(d) for d in shape.dim)
    return shapes


def output_blobs(net) -> list[str]:
    """What Caffe reports as the network's outputs: blobs that no later layer reads (an in-place layer
    reads and rewrites its blob), in the order they were last written."""
    inputs = input_shapes(net)
    available: dict[str, None] = dict.fromkeys(inputs)
    written: set[str] = set()
    for layer in layers_of(net):
        if layer.type == "Input":
            continue
        for bottom in layer.bottom:
            available.pop(bottom, None)
        for top in layer.top:
            available.pop(top, None)
            available[top] = None
            written.add(top)
    return [name for name in available if name in written]


# --- parameters as Caffe resolves them --------------------------------------------------------------------


def _has(param, name: str) -> bool:
    return param.HasField(f"{name}_h") or param.HasField(f"{name}_w")


def _pair(repeated, single_h: int, single_w: int, has_hw: bool, default: int) -> tuple[int, int]:
    """``x_h``/``x_w`` when given, else the repeated field (one value, or one per spatial axis), else the default."""
    if has_hw:
        return int(single_h), int(single_w)
    values = list(repeated)
    if not values:
        return default, default
    if len(values) == 1:
        return int(values[0]), int(values[0])
    if len(values) == 2:
        return int(values[0]), int(values[1])
    raise UnsupportedModelError(f"{len(values)} values per spatial axis; only 2-D convolution is supported")


def conv_geometry(param) -> dict[str, tuple[int, int]]:
    kernel = _pair(param.kernel_size, param.kernel_h, param.kernel_w, _has(param, "kernel"), 0)
    pad = _pair(param.pad, param.pad_h, param.pad_w, _has(param, "pad"), 0)
    stride = _pair(param.stride, param.stride_h, param.stride_w, _has(param, "stride"), 1)
    dilation = _pair(param.dilation, 0, 0, False, 1)
    return {"kernel": kernel, "pad": pad, "stride": stride, "dilation": dilation}


def pool_geometry(param, height: int, width: int) -> dict[str, tuple[int, int]]:
    if param.global_pooling:
        return {"kernel": (height, width), "pad": (0, 0), "stride": (1, 1)}
    kernel = (param.kernel_h, param.kernel_w) if _has(param, "kernel") else (param.kernel_size,) * 2
    pad = (param.pad_h, param.pad_w) if _has(param, "pad") else (param.pad,) * 2
    stride = (param.stride_h, param.stride_w) if _has(param, "stride") else (param.stride,) * 2
    return {"kernel": tuple(map(int, kernel)), "pad": tuple(map(int, pad)), "stride": tuple(map(int, stride))}


def pooled_size(size: int, kernel: int, pad: int, stride: int, ceil: bool, padded: bool) -> int:
    """Caffe's pooled extent: ceil (default) or floor rounding; with padding, the last window must start
    inside the image plus its leading padding."""
    span = size + 2 * pad - kernel
    out = (-(-span // stride) if ceil else span // stride) + 1
    if padded and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def pooled_shape(param, shape: Shape) -> Shape:
    n, c, h, w = shape
    if param.global_pooling:
        return (n, c, 1, 1)
    geo = pool_geometry(param, h, w)
    (kh, kw), (ph, pw), (sh, sw) = geo["kernel"], geo["pad"], geo["stride"]
    ceil, padded = param.round_mode == 0, bool(ph or pw)
    return (n, c, pooled_size(h, kh, ph, sh, ceil, padded), pooled_size(w, kw, pw, sw, ceil, padded))


def onnx_pool_pads(param, shape: Shape) -> tuple[int, list[int]]:
    """``(ceil_mode, pads)`` of an ONNX pool that reproduces Caffe's output size *and* on which onnx's shape
    inference and onnxruntime agree.

    Caffe's ceil rounding drops the last window when it would start past the image plus its leading
    padding. onnxruntime applies the same rule, onnx's shape inference does not: where the rule drops a
    window, the pool is written in floor mode with the trailing padding that gives Caffe's size instead.
    That is exact for MAX; for AVE only while the trailing padding stays within Caffe's (its divisor counts
    the window up to the padded edge), otherwise ``UnsupportedModelError``."""
    _, _, h, w = shape
    geo = pool_geometry(param, h, w)
    ceil, padded = param.round_mode == 0, bool(geo["pad"][0] or geo["pad"][1])
    begin, end, dropped = list(geo["pad"]), [], False
    for size, k, p, s in zip((h, w), geo["kernel"], geo["pad"], geo["stride"]):
        out = pooled_size(size, k, p, s, ceil, padded)
        dropped |= out != pooled_size(size, k, p, s, ceil, False)
        end.append(max(0, (out - 1) * s + k - size - p))
    if not dropped:
        return int(ceil), begin + begin
    if param.pool == 1 and any(e > p for e, p in zip(end, begin)):
        raise UnsupportedModelError(
            f"Pooling: AVE pooling of {h}x{w} with kernel {list(geo['kernel'])}, pad {begin}, stride {list(geo['stride'])} "
            "has no ONNX form that onnx and onnxruntime agree on"
        )
    return 0, begin + end


def channel_shape(rank: int, axis: int, dims: Shape) -> Shape:
    """Broadcast shape of a per-channel parameter with ``dims`` at ``axis`` of a ``rank``-D blob."""
    return (1,) * axis + tuple(dims) + (1,) * (rank - axis - len(dims))


def reshape_target(layer, shape: Shape) -> Shape:
    """Caffe's Reshape: ``shape`` replaces dims [axis, axis + num_axes); 0 copies, -1 infers."""
    param = layer.reshape_param
    rank = len(shape)
    start = param.axis if param.axis >= 0 else param.axis + rank + 1
    end = rank if param.num_axes == -1 else start + int(param.num_axes)
    if not 0 <= start <= end <= rank:
        raise InputError(f"Reshape '{layer.name}': axis {param.axis} / num_axes {param.num_axes} do not fit a {rank}-D bottom")
    dims = [int(d) for d in param.shape.dim]
    middle = [shape[start + i] if d == 0 else d for i, d in enumerate(dims)]
    if middle.count(-1) > 1:
        raise InputError(f"Reshape '{layer.name}' infers more than one dimension (-1)")
    target = list(shape[:start]) + middle + list(shape[end:])
    if -1 in target:
        known = math.prod(d for d in target if d != -1)
        target[target.index(-1)] = math.prod(shape) // known if known else 0
    if math.prod(target) != math.prod(shape):
        raise InputError(f"Reshape '{layer.name}' cannot turn {list(shape)} into {target}")
    return tuple(target)


def crop_offsets(layer, data: Shape, size: Shape) -> tuple[int, ...]:
    """Caffe's Crop: the offset of every axis of ``data`` (0 before ``axis``), the top taking ``size``'s
    dims from ``axis`` on. ``offset``: none (0), one for every cropped axis, or one per cropped axis."""
    param = layer.crop_param
    rank = len(data)
    if len(size) != rank:
        raise InputError(f"Crop '{layer.name}' crops a {rank}-D blob to the shape of a {len(size)}-D one; both need the same rank")
    if not -rank <= param.axis < rank:
        raise InputError(f"Crop '{layer.name}': axis {param.axis} does not fit a {rank}-D bottom")
    start = param.axis % rank
    given = [int(v) for v in param.offset]
    if len(given) > 1 and len(given) != rank - start:
        raise InputError(f"Crop '{layer.name}' gives {len(given)} offsets for the {rank - start} axes it crops (from axis {start}); "
                         "give one, or one per cropped axis")
    offsets = [0] * start + [given[0] if len(given) == 1 else given[i - start] if given else 0 for i in range(start, rank)]
    for i in range(start, rank):
        if data[i] - offsets[i] < size[i]:
            raise InputError(f"Crop '{layer.name}': axis {i} of size {data[i]} cannot give {size[i]} from offset {offsets[i]}")
    return tuple(offsets)


def crop_shape(layer, data: Shape, size: Shape) -> Shape:
    crop_offsets(layer, data, size)  # validates
    start = layer.crop_param.axis % len(data)
    return tuple(data[:start]) + tuple(size[start:])


def flatten_target(layer, shape: Shape) -> Shape:
    start = layer.flatten_param.axis % len(shape)
    end = layer.flatten_param.end_axis % len(shape)
    return shape[:start] + (math.prod(shape[start : end + 1]),) + shape[end + 1 :]


# --- shapes -----------------------------------------------------------------------------------------------


def _conv_shape(layer, shape: Shape) -> Shape:
    param = layer.convolution_param
    geo = conv_geometry(param)
    extent = [d * (k - 1) + 1 for d, k in zip(geo["dilation"], geo["kernel"])]
    if layer.type == "Deconvolution":
        spatial = [s * (i - 1) + e - 2 * p for i, s, e, p in zip(shape[2:], geo["stride"], extent, geo["pad"])]
    else:
        spatial = [(i + 2 * p - e) // s + 1 for i, s, e, p in zip(shape[2:], geo["stride"], extent, geo["pad"])]
    return (shape[0], int(param.num_output), *spatial)


def _top_shape(layer, shapes: list[Shape]) -> Shape:
    kind, first = layer.type, shapes[0]
    if kind in ("Convolution", "Deconvolution"):
        return _conv_shape(layer, first)
    if kind == "Pooling":
        return pooled_shape(layer.pooling_param, first)
    if kind == "InnerProduct":
        axis = layer.inner_product_param.axis % len(first)
        return first[:axis] + (int(layer.inner_product_param.num_output),)
    if kind == "Concat":
        param = layer.concat_param
        axis = (param.concat_dim if param.HasField("concat_dim") else param.axis) % len(first)
        return first[:axis] + (sum(s[axis] for s in shapes),) + first[axis + 1 :]
    if kind == "Flatten":
        return flatten_target(layer, first)
    if kind == "Crop":
        return crop_shape(layer, first, shapes[1])
    if kind == "Reshape":
        return reshape_target(layer, first)
    return first  # element-wise and normalisation layers keep their bottom's shape


def infer_shapes(net) -> dict[str, Shape]:
    """Every blob's shape after the layer that last writes it, plus ``(layer name, bottom) -> shape`` as
    each layer sees its bottoms (in-place layers rewrite a blob)."""
    shapes: dict = dict(input_shapes(net))
    for layer in layers_of(net):
        if layer.type == "Input":
            continue
        bottoms = [shapes[b] for b in layer.bottom]
        for b, s in zip(layer.bottom, bottoms):
            shapes[(layer.name, b)] = s
        top = _top_shape(layer, bottoms)
        for name in layer.top:
            shapes[name] = top
    return shapes
